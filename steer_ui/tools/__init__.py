"""Benchmark and report builders; the runtime never imports this package."""
