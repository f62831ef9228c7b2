"""Grafana side of ttft-pipeline: dashboards as code, the plugin's macro expansion, provisioning and push.

- :mod:`streams.grafana.macros`: the ``grafana-clickhouse-datasource`` query pipeline (conditionalAll,
  template variables, backend macros) reproduced exactly, so tests run panel SQL on ClickHouse.
- :mod:`streams.grafana.build`: the six dashboards (``dashboards/*.json``, and ``deploy/grafana/import/*.json``
  for a UI import) and the optional alert rules; :mod:`streams.grafana.render` builds their JSON with
  grafana-foundation-sdk, :mod:`streams.grafana.links` the links between them.
- :mod:`streams.grafana.push`: ``ttft grafana push``.
"""
