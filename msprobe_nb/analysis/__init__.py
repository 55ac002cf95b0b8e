"""Analysis layer: matching two dumps, msprobe's metrics, grading, first divergence, provenance."""
