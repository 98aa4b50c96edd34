package vaulttest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A test process that dies before its cleanups (here a panic on a
// goroutine of its own, as a -timeout's is) leaves its network and its
// processes, in a namespace and in the host's; ReapStale, from its state
// file, removes them all and the file, and leaves a live process's alone.
func TestReapStale_AfterAPanic(t *testing.T) {
	if os.Getenv("VAULTTEST_REAP_CHILD") == "1" {
		reapChild(t)
		return
	}
	SkipUnlessEnabled(t)
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	// This process's own network, which the reaper must leave alone.
	mine := NewNetwork(t, 1)

	cmd := exec.Command(os.Args[0], "-test.run", "^TestReapStale_AfterAPanic$", "-test.v")
	// The child's state file is its own (StateDir), as an acceptance
	// test's is.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VAULTTEST_NET_STATE=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "VAULT_ACC=1", "VAULTTEST_REAP_CHILD=1")
	out, _ := cmd.CombinedOutput()
	var ns, bridge, stateFile string
	var pids []int
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 6 && f[0] == "REAP-CHILD" {
			ns, bridge, stateFile = f[1], f[2], f[3]
			for _, s := range f[4:] {
				pid, _ := strconv.Atoi(s)
				pids = append(pids, pid)
			}
		}
	}
	if ns == "" || !strings.Contains(string(out), "panic: on purpose") {
		t.Fatalf("the child did not make its network and die of its panic:\n%s", out)
	}
	// What it left, before the reaper.
	if _, err := os.Stat("/run/netns/" + ns); err != nil {
		t.Fatalf("the child's namespace %s is gone before the reaper ran: the test proves nothing", ns)
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) != nil {
			t.Fatalf("the child's process %d is gone before the reaper ran", pid)
		}
	}

	removed := ReapStale()
	t.Logf("removed: %v", removed)
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil || isZombieOf(pid) {
			if time.Now().After(deadline) {
				t.Errorf("process %d left alive", pid)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if list, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(list), ns) {
		t.Errorf("namespace %s left: %s", ns, list)
	}
	if exec.Command("ip", "link", "show", bridge).Run() == nil {
		t.Errorf("bridge %s left", bridge)
	}
	if veth := strings.TrimSuffix(bridge, "b") + "h1"; exec.Command("ip", "link", "show", veth).Run() == nil {
		t.Errorf("veth %s left", veth)
	}
	if _, err := os.Stat(stateFile); err == nil {
		t.Errorf("state file %s left", stateFile)
	}
	if _, err := os.Stat("/run/netns/" + mine.Nodes[0].NS); err != nil {
		t.Errorf("the reaper removed a live process's namespace %s", mine.Nodes[0].NS)
	}
}

// isZombieOf: pid exited but is not yet reaped by a parent (the child's
// processes' parent is init once the child died: reaped soon).
func isZombieOf(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

// reapChild is the child's side: a network, a process in its namespace and
// one in the host's, then a panic off the test's goroutine.
func reapChild(t *testing.T) {
	nw := NewNetwork(t, 1)
	dir := t.TempDir()
	bin, args := nw.Exec(0, "sleep", "300")
	in := StartProcess(t, "sleep-in-ns", dir, nil, bin, args...)
	host := StartProcess(t, "sleep-in-host", dir, nil, "sleep", "300")
	fmt.Printf("REAP-CHILD %s %s %s %d %d\n", nw.Nodes[0].NS, nw.bridge, stateFile(), in.PID(), host.PID())
	os.Stdout.Sync()
	go func() { panic("on purpose") }()
	select {}
}
