package bench

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
// It is 100 on every Linux architecture Go supports (the kernel exports
// the same value whatever its internal HZ), and reading it properly would
// need cgo's sysconf.
const clockTicks = 100

// ProcMem is a process's memory from /proc/<pid>/status, in bytes.
type ProcMem struct {
	RSS, HWM, Anon, File int64
}

// ReadMem reads VmRSS, VmHWM (peak RSS), RssAnon and RssFile of pid.
func ReadMem(pid int) (ProcMem, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcMem{}, err
	}
	defer f.Close()
	var m ProcMem
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) < 1 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			m.RSS = n << 10
		case "VmHWM":
			m.HWM = n << 10
		case "RssAnon":
			m.Anon = n << 10
		case "RssFile":
			m.File = n << 10
		}
	}
	return m, sc.Err()
}

// ReadCPU returns the user+system CPU time pid has used so far.
func ReadCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	// Fields after the command name start at field 3 (state); utime and
	// stime are fields 14 and 15.
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// Machine describes where the bench ran.
type Machine struct {
	CPUs      int
	CPUModel  string
	MemTotal  string
	GoVersion string
	OS        string
}

// ReadMachine collects nproc, the CPU model, total memory and the Go
// toolchain version.
func ReadMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "MemTotal:") {
				f := strings.Fields(l)
				if len(f) >= 2 {
					kb, _ := strconv.ParseInt(f[1], 10, 64)
					m.MemTotal = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
				}
			}
		}
	}
	if out, err := exec.Command("go", "version").Output(); err == nil {
		m.GoVersion = strings.TrimSpace(string(out))
	}
	return m
}
