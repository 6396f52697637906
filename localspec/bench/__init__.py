"""``localspec bench``'s engine side: workloads (``workloads``), measuring (``runner``), results (``report``)."""
