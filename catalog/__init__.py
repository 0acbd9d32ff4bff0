"""GPU specs, priced cloud offers and model presets, as versioned data with a schema."""
