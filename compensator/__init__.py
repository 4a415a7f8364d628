"""The compensator: retries failed deliveries until they succeed, sweeps deliveries left
pending too long, and runs operator replays. (This first version only reports what is due.)"""
