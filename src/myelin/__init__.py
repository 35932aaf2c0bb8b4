"""MyeLiN: the IREE compiler adapter and the runtime that loads and runs .mln artifacts."""
