"""Benchmark tasks, models and runners behind ``gact-fx bench`` and ``benchmarks/``.

Their optional dependencies, the ``bench`` extra (transformers, torch_geometric, mnist1d,
scikit-learn, matplotlib, tqdm), are imported where used.
"""
