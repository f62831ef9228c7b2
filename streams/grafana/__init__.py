"""Grafana side of ttft-pipeline: dashboards as code, the plugin's macro expansion, provisioning and push.

- :mod:`streams.grafana.macros`: the ``grafana-clickhouse-datasource`` query pipeline (conditionalAll,
  template variables, backend macros) reproduced exactly, so tests run panel SQL on ClickHouse.
- :mod:`streams.grafana.build`: the five dashboards (``dashboards/*.json``) and the optional alert rules.
- :mod:`streams.grafana.push`: ``ttft grafana push``.
"""
