"""Writers of seeded-random models at published shapes, for timing real-sized passes without downloads."""
