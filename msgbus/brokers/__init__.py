"""Broker adapters: Kafka (confluent-kafka), RabbitMQ (pika) and direct (HTTP to a dispatcher)."""
