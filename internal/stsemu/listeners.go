package stsemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// The states of a listener. A listener that is down plays a region whose STS
// endpoint is out while the others, which share the emulator's state (its
// IAM users and keys, the credentials it issued, its faults and call log),
// keep serving: a client with a fallback endpoint must reach one of them.
// Two emulators would be two IAMs, and a key rotated on one would be unknown
// to the other.
const (
	// ListenerUp serves STS, IAM and the control API.
	ListenerUp = "up"
	// ListenerRefused is closed: every connection to it is refused and
	// those open are cut. Its port stays held (bound, not listening), so
	// that nothing else takes it before it comes back up.
	ListenerRefused = "refused"
	// ListenerUnavailable accepts connections and answers every STS and
	// IAM call with 503 ServiceUnavailable, as an overloaded or failing
	// region does; the call is recorded with that outcome. Its control API
	// still answers.
	ListenerUnavailable = "unavailable"
)

// ListenerView is one listener as Listeners and GET /_emulator/listeners
// show it.
type ListenerView struct {
	// Addr is the address it is bound to (host:port); Call.Listener names
	// the listener a call came through by it.
	Addr  string `json:"addr"`
	URL   string `json:"url"`
	State string `json:"state"`
}

// listener is one address the emulator serves on.
type listener struct {
	addr  string // bound address, host:port, port resolved
	state string
	srv   *http.Server // nil while refused
	// served receives srv.Serve's result.
	served chan error
	// hold keeps the port while refused; nil otherwise.
	hold io.Closer
}

// Listen serves the emulator on addr (host:port; port 0 picks a free one)
// in addition to any other listener, and returns its URL. Every listener
// shares the emulator's state; Close stops them all.
func (e *Emulator) Listen(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	l := &listener{addr: ln.Addr().String(), state: ListenerUp}
	e.lmu.Lock()
	defer e.lmu.Unlock()
	if e.closed {
		ln.Close()
		return "", errors.New("stsemu: the emulator is closed")
	}
	e.serve(l, ln)
	e.listeners = append(e.listeners, l)
	return "http://" + l.addr, nil
}

// serve starts an http.Server for l on ln. Called with e.lmu held.
func (e *Emulator) serve(l *listener, ln net.Listener) {
	l.srv = &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second}
	l.served = make(chan error, 1)
	go func(srv *http.Server, served chan<- error) { served <- srv.Serve(ln) }(l.srv, l.served)
}

// Listeners returns every listener, in the order they were opened.
func (e *Emulator) Listeners() []ListenerView {
	e.lmu.Lock()
	defer e.lmu.Unlock()
	out := make([]ListenerView, 0, len(e.listeners))
	for _, l := range e.listeners {
		out = append(out, ListenerView{Addr: l.addr, URL: "http://" + l.addr, State: l.state})
	}
	return out
}

// SetListenerState takes the listener bound to addr (as Listeners names it,
// or its URL) down (ListenerRefused, ListenerUnavailable) or brings it back
// up (ListenerUp).
func (e *Emulator) SetListenerState(addr, state string) error {
	addr = strings.TrimPrefix(addr, "http://")
	switch state {
	case ListenerUp, ListenerRefused, ListenerUnavailable:
	default:
		return fmt.Errorf("listener state %q: want %s, %s or %s", state, ListenerUp, ListenerRefused, ListenerUnavailable)
	}
	e.lmu.Lock()
	defer e.lmu.Unlock()
	if e.closed {
		return errors.New("stsemu: the emulator is closed")
	}
	var l *listener
	for _, x := range e.listeners {
		if x.addr == addr {
			l = x
		}
	}
	if l == nil {
		return fmt.Errorf("no listener on %q; GET %slisteners lists them", addr, controlPrefix)
	}
	if l.state == state {
		return nil
	}
	if state == ListenerRefused {
		// Close cuts the open connections too: a client's keep-alive
		// connection to a region that went down does not survive either.
		_ = l.srv.Close()
		<-l.served
		l.srv = nil
		h, err := holdPort(l.addr)
		if err != nil {
			// Still refused; only the port is not reserved.
			h = nil
		}
		l.hold, l.state = h, ListenerRefused
		return nil
	}
	if l.state == ListenerRefused {
		if l.hold != nil {
			// The port must be free to listen again: the instant between
			// the two is the only one in which another socket could take it.
			_ = l.hold.Close()
			l.hold = nil
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			return fmt.Errorf("listening on %s again: %w", l.addr, err)
		}
		e.serve(l, ln)
	}
	l.state = state
	return nil
}

// listenerDown reports whether the listener a request came through (its
// connection's local address) is ListenerUnavailable, and names it.
func (e *Emulator) listenerOf(r *http.Request) (addr string, unavailable bool) {
	a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return "", false
	}
	addr = a.String()
	e.lmu.Lock()
	defer e.lmu.Unlock()
	for _, l := range e.listeners {
		if sameListener(l.addr, addr) {
			return l.addr, l.state == ListenerUnavailable
		}
	}
	return addr, false
}

// sameListener reports whether a connection with local address conn came
// through a listener bound to bound: the same address, or the same port
// when the listener is bound to every interface.
func sameListener(bound, conn string) bool {
	if bound == conn {
		return true
	}
	bh, bp, err1 := net.SplitHostPort(bound)
	_, cp, err2 := net.SplitHostPort(conn)
	if err1 != nil || err2 != nil || bp != cp {
		return false
	}
	ip := net.ParseIP(bh)
	return bh == "" || (ip != nil && ip.IsUnspecified())
}

// closeListeners stops every listener and releases held ports; graceful
// lets requests in flight finish (until ctx ends).
func (e *Emulator) closeListeners(ctx context.Context, graceful bool) error {
	e.lmu.Lock()
	e.closed = true
	ls := e.listeners
	e.lmu.Unlock()
	var first error
	for _, l := range ls {
		if l.hold != nil {
			_ = l.hold.Close()
		}
		if l.srv == nil {
			continue
		}
		if graceful {
			if err := l.srv.Shutdown(ctx); err != nil {
				_ = l.srv.Close()
			}
		} else {
			_ = l.srv.Close()
		}
		if err := <-l.served; err != nil && !errors.Is(err, http.ErrServerClosed) && first == nil {
			first = err
		}
	}
	return first
}
