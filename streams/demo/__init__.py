"""``ttft demo``: the whole product in a few minutes, on a laptop, from one command.

:mod:`.plan` lays the story out in event time (pure), :mod:`.processes` starts and reliably stops the
children, :mod:`.alerting` runs Alertmanager with a recording webhook, :mod:`.pipeline` starts the
workers and watches them drain, :mod:`.view` is the live view, :mod:`.summary` reads the conclusions
from the store and writes the report, and :mod:`.run` ties them together.
"""

from streams.demo.plan import DemoPlan, plan_demo
from streams.demo.run import DemoError, DemoOptions, run_demo

__all__ = ["DemoError", "DemoOptions", "DemoPlan", "plan_demo", "run_demo"]
