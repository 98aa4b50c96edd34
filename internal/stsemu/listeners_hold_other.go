//go:build !linux

package stsemu

import (
	"errors"
	"io"
)

// holdPort is Linux's only: elsewhere a refused listener's port is free
// until it listens again.
func holdPort(string) (io.Closer, error) {
	return nil, errors.New("holding a port is implemented on Linux only")
}
