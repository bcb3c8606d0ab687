"""Monitoring as code: the Prometheus rules and Grafana dashboards are rendered from
``deploy/alerting.yaml`` by ``python -m deploy.generate``; the rendered files are checked in."""
