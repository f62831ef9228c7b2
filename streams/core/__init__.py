"""The pure core: join, sketches, attribution, rules (no Kafka, no Faust; time is injected).

The join's hot modules run compiled by mypyc when a current build exists (see
:mod:`streams.core.native`); this must happen before any of them is imported.
"""

from streams.core.native import activate

activate(__path__)
