package stsemu

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// TestRefusedListenerHoldsPort: while a listener is refused its port stays
// bound, so a socket bound without SO_REUSEADDR (as the kernel picks the
// ephemeral port of an outgoing connection) cannot have it, and the port is
// free again once the listener is back up and closed.
func TestRefusedListenerHoldsPort(t *testing.T) {
	e := startEmulator(t, Config{})
	// A listener no connection ever reached: nothing of it lingers in
	// TIME_WAIT, so only the hold can keep its port.
	third, err := e.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ta, err := net.ResolveTCPAddr("tcp", third[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	bind := func() error {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		return syscall.Bind(fd, &syscall.SockaddrInet4{Port: ta.Port, Addr: [4]byte{127, 0, 0, 1}})
	}
	if err := e.SetListenerState(third, ListenerRefused); err != nil {
		t.Fatal(err)
	}
	if err := bind(); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("binding the refused listener's port: %v, want EADDRINUSE (held)", err)
	}
	if err := e.SetListenerState(third, ListenerUp); err != nil {
		t.Fatal(err)
	}
	e.Close()
	if err := bind(); err != nil {
		t.Fatalf("binding the port after Close: %v, want it free (the hold released)", err)
	}
}
