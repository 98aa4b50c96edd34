package ratelimit

// ratelimit has no test file: not counted.
