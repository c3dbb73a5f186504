"""Benchmark tasks, models and runners behind ``gact-fx bench`` and ``benchmarks/``.

Optional dependencies (mnist1d, transformers, matplotlib) are imported where used.
"""
