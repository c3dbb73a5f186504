"""Graph passes: find saved activations, plan their compression, rewrite the graphs."""
