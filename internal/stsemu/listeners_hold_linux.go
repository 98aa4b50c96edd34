package stsemu

import (
	"io"
	"net"
	"syscall"
)

// holdPort binds a TCP socket to addr without listening on it. The kernel
// answers a connection attempt to a port with a bound but not listening
// socket with a RST (connection refused), as it does for a free port, and
// the port stays reserved: an outgoing connection cannot be given it as its
// ephemeral port, nor can another listener take it.
func holdPort(addr string) (io.Closer, error) {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, err
	}
	family, sa := syscall.AF_INET, syscall.Sockaddr(nil)
	if ip4 := ta.IP.To4(); ip4 != nil || ta.IP == nil {
		s := &syscall.SockaddrInet4{Port: ta.Port}
		copy(s.Addr[:], ip4)
		sa = s
	} else {
		family = syscall.AF_INET6
		s := &syscall.SockaddrInet6{Port: ta.Port}
		copy(s.Addr[:], ta.IP.To16())
		sa = s
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	// SO_REUSEADDR, as Go sets on its listeners: the port's connections cut
	// when the listener closed linger in TIME_WAIT.
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return heldPort(fd), nil
}

// heldPort is the socket holdPort bound.
type heldPort int

func (h heldPort) Close() error { return syscall.Close(int(h)) }
