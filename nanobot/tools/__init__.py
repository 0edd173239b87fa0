"""Tools: the functions the model can call, natively or from code."""
