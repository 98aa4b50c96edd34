package plugin

// c30 has gocyclo complexity 30, at the limit: 1 + for + range + 2 select
// cases + 11 switch cases + 10 && and || + 4 ifs. Counting a default case
// would push it over.
func c30(x int, ch chan int, xs []int) int {
	a, b, c, d, e := x > 1, x > 2, x > 3, x > 4, x > 5
	for i := 0; i < x; i++ {
	}
	for range xs {
	}
	select {
	case <-ch:
	case ch <- 1:
	default:
	}
	switch x {
	case 1, 2:
	case 3:
	case 4:
	case 5:
	case 6:
	case 7:
	case 8:
	case 9:
	case 10:
	case 11:
	case 12:
	default:
	}
	if a && b || c && d {
		x++
	}
	if a && b && c && d {
		x++
	}
	if a || b || c || d && e {
		x++
	}
	if e {
		x++
	}
	return x
}

// c31 has gocyclo complexity 31: 1 + 25 ifs + 5 ifs in a function literal,
// which counts toward the function it is written in.
func (b *backend) c31(x int) int {
	if x == 0 {
		x++
	}
	if x == 1 {
		x++
	}
	if x == 2 {
		x++
	}
	if x == 3 {
		x++
	}
	if x == 4 {
		x++
	}
	if x == 5 {
		x++
	}
	if x == 6 {
		x++
	}
	if x == 7 {
		x++
	}
	if x == 8 {
		x++
	}
	if x == 9 {
		x++
	}
	if x == 10 {
		x++
	}
	if x == 11 {
		x++
	}
	if x == 12 {
		x++
	}
	if x == 13 {
		x++
	}
	if x == 14 {
		x++
	}
	if x == 15 {
		x++
	}
	if x == 16 {
		x++
	}
	if x == 17 {
		x++
	}
	if x == 18 {
		x++
	}
	if x == 19 {
		x++
	}
	if x == 20 {
		x++
	}
	if x == 21 {
		x++
	}
	if x == 22 {
		x++
	}
	if x == 23 {
		x++
	}
	if x == 24 {
		x++
	}
	f := func() {
		if x == 100 {
			x--
		}
		if x == 101 {
			x--
		}
		if x == 102 {
			x--
		}
		if x == 103 {
			x--
		}
		if x == 104 {
			x--
		}
	}
	f()
	return x
}
