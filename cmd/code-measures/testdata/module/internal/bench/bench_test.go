package bench

// bench is not a mechanism: not counted.
