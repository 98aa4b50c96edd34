package dueplan

// dueplan has only a test file: counted.
