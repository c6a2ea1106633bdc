"""npuops top-k selection family (plugin ``topk``)."""
