"""The dispatcher: consumes each subscription's stream and pushes every message to the
subscriber's URL under the subscription's own concurrency limit, recording every attempt."""
