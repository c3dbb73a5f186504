"""Runtime: the ``gact::`` ops, the packed format, its reference kernels and the seeds."""
