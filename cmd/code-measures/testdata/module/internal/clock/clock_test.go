package clock
