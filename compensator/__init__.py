"""The compensator: retries failed deliveries until they succeed or are parked, one retry loop
per subscription (`retrier`); sweeps deliveries left pending too long into due retries, and
keeps the retry gauges (`sweeper`); and runs the operators' replay jobs (`replays`). Several
compensators share the work through leases in MongoDB (`service` wires the parts)."""
