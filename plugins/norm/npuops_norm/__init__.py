"""npuops normalization family (plugin ``norm``)."""
