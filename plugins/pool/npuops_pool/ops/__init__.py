"""One module per op (named after it); modules starting with "_" hold shared spec pieces."""
