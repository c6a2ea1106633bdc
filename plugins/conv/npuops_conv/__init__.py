"""npuops convolution family (plugin ``conv``)."""
