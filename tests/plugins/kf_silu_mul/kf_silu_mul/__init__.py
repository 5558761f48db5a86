"""The silu_mul problem plugin (scaffolded by `kernel-factory new silu_mul`)."""
