from streams.core.watermarks import SourceWatermarks


def test_progress_needs_every_heard_source_on_every_target() -> None:
    wm = SourceWatermarks(source_partitions=2)
    assert wm.progress([0, 1]) is None
    wm.observe(0, 0, 100.0)
    assert wm.progress([0, 1]) is None  # source 0 unheard on target 1
    wm.observe(0, 1, 120.0)
    assert wm.progress([0, 1]) == 100.0  # source 1 never had data: it does not hold the others back
    wm.observe(1, 0, 300.0)
    assert wm.progress([0, 1]) is None  # source 1 unheard on target 1
    wm.observe(1, 1, 90.0)
    assert wm.progress([0, 1]) == 90.0


def test_progress_is_the_minimum_and_never_goes_back() -> None:
    wm = SourceWatermarks(source_partitions=1)
    wm.observe(0, 0, 100.0)
    wm.observe(0, 1, 50.0)
    assert wm.progress([0, 1]) == 50.0
    assert wm.progress([0]) == 100.0
    wm.observe(0, 1, 40.0)  # an older heartbeat read late changes nothing
    assert wm.progress([0, 1]) == 50.0
