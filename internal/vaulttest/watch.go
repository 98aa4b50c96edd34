package vaulttest

import (
	"errors"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// Node states as WatchStates reports them, from sys/health.
const (
	StateActive   = "active"    // 200
	StateStandby  = "standby"   // 429, or 473 (performance standby)
	StateSealed   = "sealed"    // 503
	StateUninit   = "uninit"    // 501
	StateNoAnswer = "no_answer" // no answer within the poll's timeout (a node stepping down holds the lock health needs)
	StateDown     = "down"      // connection refused: the process is not there
	StateOther    = "other"
)

// stateOf maps a sys/health answer to a state.
func stateOf(code int, err error) string {
	switch {
	case err != nil && isRefused(err):
		return StateDown
	case err != nil:
		return StateNoAnswer
	case code == 200:
		return StateActive
	case code == 429 || code == 473:
		return StateStandby
	case code == 503:
		return StateSealed
	case code == 501:
		return StateUninit
	}
	return StateOther
}

// WatchStates polls every node's sys/health every interval, each node on
// its own goroutine with a timeout of interval×4 so that a node that does
// not answer holds up no other, and calls change with the node's index and
// its new state each time it changes (and once at the start). A poll's
// time is when its answer came. It returns the watch's stop, which waits
// for the pollers.
func (c *Cluster) WatchStates(interval time.Duration, change func(node int, state string, at time.Time)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 4 * interval}
	for i, s := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := ""
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				code := 0
				resp, err := client.Get(s.Addr + "/v1/sys/health")
				if err == nil {
					code = resp.StatusCode
					resp.Body.Close()
				}
				if st := stateOf(code, err); st != last {
					last = st
					change(i, st, time.Now())
				}
				select {
				case <-done:
					return
				case <-t.C:
				}
			}
		}()
	}
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}

// isRefused reports whether err is a refused connection.
func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
