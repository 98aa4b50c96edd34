package clock

type Clock interface{}
