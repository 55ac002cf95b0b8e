"""Store layer: the calls table schema, the kit's HDF5 dumps and msprobe's dump folders."""
