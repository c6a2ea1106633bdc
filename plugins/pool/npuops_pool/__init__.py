"""npuops pooling family (plugin ``pool``)."""
