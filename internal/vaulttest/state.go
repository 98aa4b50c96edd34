package vaulttest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// The objects a test process makes outside itself (the process groups of
// StartProcess, the namespaces and links of NewNetwork) are noted in a
// state file as they are made, one a line, before they are made:
//
//	owner PID START   the test process that made them (first line)
//	pgrp PID START    a process group: its leader's pid and start time
//	netns NAME        a network namespace (ip netns)
//	link NAME         a link in the host's namespace (the bridge)
//	gone KIND NAME    the netns or link NAME was removed by its cleanup
//	                  (its name may be another network's later)
//
// START is the process's start time in clock ticks since boot (field 22 of
// /proc/PID/stat): a pid the kernel has since given to another process
// does not match it, so nothing is killed but what the test started.
//
// A test process that ends normally removes everything in its cleanups; one
// that dies first (a panic on a goroutine other than the test's, the test
// binary's -timeout, a SIGKILL) leaves them behind. The state file is then
// the way to remove them: scripts/soak.sh, which sets VAULTTEST_NET_STATE
// to its own file, does it in its exit trap, in shell; without that
// variable the file is this process's own in StateDir, and ReapStale,
// which every test binary of vaulttest runs first (Main) and NewNetwork
// runs before making a network, removes what the dead processes of
// earlier runs left.

// StateDir holds the state files of test processes that have no
// VAULTTEST_NET_STATE: /run's (a tmpfs, emptied at boot, as the processes
// and namespaces it names are) when writable, else the temp directory's.
func StateDir() string {
	if os.Geteuid() == 0 {
		return "/run/aws-resilient-vaulttest"
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("aws-resilient-vaulttest-%d", os.Getuid()))
}

var (
	stateMu   sync.Mutex
	statePath string // this process's state file, once chosen
)

// stateFile returns this process's state file, writing its owner line when
// it is first chosen; "" when none can be written.
func stateFile() string {
	stateMu.Lock()
	defer stateMu.Unlock()
	if statePath != "" {
		return statePath
	}
	start, err := startTime(os.Getpid())
	if err != nil {
		return ""
	}
	path := os.Getenv("VAULTTEST_NET_STATE")
	if path == "" {
		dir := StateDir()
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return ""
		}
		// The start time too: a dead process's file is never a later
		// one's with the same pid.
		path = filepath.Join(dir, fmt.Sprintf("%d-%d.state", os.Getpid(), start))
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return ""
	}
	fmt.Fprintf(f, "owner %d %d\n", os.Getpid(), start)
	f.Close()
	statePath = path
	return path
}

// noteState appends one line to this process's state file.
func noteState(line string) {
	path := stateFile()
	if path == "" {
		return
	}
	stateMu.Lock()
	defer stateMu.Unlock()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	fmt.Fprintln(f, line)
	f.Close()
}

// notePgrp notes the process group whose leader is pid.
func notePgrp(pid int) {
	if start, err := startTime(pid); err == nil {
		noteState(fmt.Sprintf("pgrp %d %d", pid, start))
	}
}

// dropOwnState removes this process's own state file (not the script's
// VAULTTEST_NET_STATE) once its cleanups have run.
func dropOwnState() {
	stateMu.Lock()
	defer stateMu.Unlock()
	if statePath != "" && os.Getenv("VAULTTEST_NET_STATE") == "" {
		os.Remove(statePath)
	}
}

// startTime is pid's start time in clock ticks since boot.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64) // field 22; f[0] is field 3
}

// alive reports whether pid is still the process that started at start.
func alive(pid int, start uint64) bool {
	s, err := startTime(pid)
	return err == nil && s == start
}

// stateEntry is one line of a state file.
type stateEntry struct {
	kind, name string
	pid        int
	start      uint64
}

func readState(path string) ([]stateEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []stateEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		e := stateEntry{kind: fs[0], name: fs[1]}
		switch {
		case fs[0] == "gone" && len(fs) == 3:
			e.name = fs[1] + " " + fs[2]
		case len(fs) == 3:
			e.pid, _ = strconv.Atoi(fs[1])
			e.start, _ = strconv.ParseUint(fs[2], 10, 64)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

var reapOnce sync.Once

// reapStaleOnce runs ReapStale once per process.
func reapStaleOnce() { reapOnce.Do(func() { ReapStale() }) }

// ReapStale removes what test processes that died without their cleanups
// left, as their state files in StateDir name it: it kills their process
// groups (the namespaces' processes with them), deletes their namespaces
// and links, and removes the files. The files of live processes are left
// alone, and so is any name one of them also holds. It returns what it
// removed, for the log.
func ReapStale() []string {
	dir := StateDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	type file struct {
		path    string
		entries []stateEntry
	}
	var dead []file
	held := map[string]bool{} // names live owners hold
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".state") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		entries, err := readState(path)
		if err != nil {
			continue
		}
		owned := len(entries) > 0 && entries[0].kind == "owner"
		if owned && alive(entries[0].pid, entries[0].start) {
			for _, s := range entries {
				held[s.kind+" "+s.name] = true
			}
			continue
		}
		if !owned {
			// Being written: its owner line is the first thing written.
			continue
		}
		dead = append(dead, file{path, entries})
	}
	var removed []string
	for _, f := range dead {
		removed = append(removed, reap(f.entries, held)...)
		os.Remove(f.path)
	}
	return removed
}

// reap removes the objects of one dead owner's entries, save those held.
func reap(entries []stateEntry, held map[string]bool) []string {
	// What the owner's cleanups removed is not its any more: only a name
	// noted again after its removal is.
	for i, e := range entries {
		if e.kind == "gone" {
			for j := range entries[:i] {
				if entries[j].kind+" "+entries[j].name == e.name {
					entries[j].kind = "gone-" + entries[j].kind
				}
			}
		}
	}
	var removed []string
	for _, e := range entries {
		if e.kind == "pgrp" && e.pid > 0 && alive(e.pid, e.start) {
			syscall.Kill(-e.pid, syscall.SIGKILL)
			syscall.Kill(e.pid, syscall.SIGKILL)
			removed = append(removed, fmt.Sprintf("process group %d", e.pid))
		}
	}
	for _, e := range entries {
		if e.kind != "netns" || held["netns "+e.name] {
			continue
		}
		if _, err := os.Stat("/run/netns/" + e.name); err != nil {
			continue
		}
		if out, err := exec.Command("ip", "netns", "pids", e.name).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				if pid, err := strconv.Atoi(f); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if exec.Command("ip", "netns", "del", e.name).Run() == nil {
			removed = append(removed, "netns "+e.name)
		}
	}
	for _, e := range entries {
		if e.kind != "link" || held["link "+e.name] {
			continue
		}
		if exec.Command("ip", "link", "show", e.name).Run() != nil {
			continue
		}
		if exec.Command("ip", "link", "del", e.name).Run() == nil {
			removed = append(removed, "link "+e.name)
		}
	}
	return removed
}
