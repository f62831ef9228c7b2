"""Alert delivery: the Alertmanager API v2 client and the durable ``ttft.alerts`` outbox loop."""
