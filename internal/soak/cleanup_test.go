package soak_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSoakScriptCleansUpOnSignal (SOAK_CLEANUP_CHECK=1, root, a built
// Vault; under the heavy lock): scripts/soak.sh, sent SIGTERM (or SIGINT
// with SOAK_CLEANUP_SIGNAL=INT) once its readers and Vault Agent run, ends
// within a few seconds, and leaves no process it started (the nodes in
// their namespaces, the emulator and Vault Agent in the host's), no
// namespace, link or temporary directory.
func TestSoakScriptCleansUpOnSignal(t *testing.T) {
	if os.Getenv("SOAK_CLEANUP_CHECK") != "1" {
		t.Skip("starts scripts/soak.sh: set SOAK_CLEANUP_CHECK=1 (root, a built Vault, the heavy lock)")
	}
	sig, code := syscall.SIGTERM, 143
	if os.Getenv("SOAK_CLEANUP_SIGNAL") == "INT" {
		sig, code = syscall.SIGINT, 130
	}
	out := t.TempDir()
	cmd := exec.Command("./scripts/soak.sh")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "DURATION=2m", "SEED=5", "OUT="+out)
	log, err := os.Create(filepath.Join(out, "script.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	// Running: readers read and the agent has rendered.
	state := filepath.Join(out, "net-objects")
	deadline := time.Now().Add(10 * time.Minute)
	for {
		h, _ := os.ReadFile(filepath.Join(out, "history.jsonl"))
		if strings.Count(string(h), `"kind":"agent_file"`) >= 2 && strings.Contains(string(h), `"kind":"read"`) {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("soak.sh ended (%v) before its readers ran; log in %s", err, log.Name())
		case <-time.After(time.Second):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("no reads after 10 minutes")
		}
	}
	entries := readStateFile(t, state)
	if len(entries["pgrp"]) < 5 || len(entries["netns"]) != 3 {
		t.Fatalf("state file %s: %d process groups, %d namespaces; want the emulator, 3 nodes and the agent, and 3 namespaces", state, len(entries["pgrp"]), len(entries["netns"]))
	}
	for _, pg := range entries["pgrp"] {
		if pid, _ := strconv.Atoi(pg); syscall.Kill(pid, 0) != nil {
			t.Fatalf("process group %s is not running before the signal: the check proves nothing", pg)
		}
	}

	start := time.Now()
	cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("soak.sh still running 15 s after %v", sig)
	}
	took := time.Since(start)
	t.Logf("soak.sh ended %s after %v, exit %d", took.Round(time.Millisecond), sig, cmd.ProcessState.ExitCode())
	if took > 5*time.Second {
		t.Errorf("soak.sh took %s to end after %v, want a few seconds", took, sig)
	}
	if cmd.ProcessState.ExitCode() != code {
		t.Errorf("soak.sh exit %d after %v, want %d", cmd.ProcessState.ExitCode(), sig, code)
	}
	time.Sleep(500 * time.Millisecond) // the killed processes' exit
	for _, pg := range entries["pgrp"] {
		if pid, _ := strconv.Atoi(pg); syscall.Kill(pid, 0) == nil && !zombie(pid) {
			t.Errorf("process %d (%s) left running", pid, comm(pid))
		}
	}
	for _, ns := range entries["netns"] {
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			t.Errorf("namespace %s left", ns)
		}
	}
	for _, l := range entries["link"] {
		if exec.Command("ip", "link", "show", l).Run() == nil {
			t.Errorf("link %s left", l)
		}
	}
	if m, _ := filepath.Glob("/tmp/soak-tmp.*"); len(m) > 0 {
		t.Errorf("temporary directories left: %v", m)
	}
	// go test and its test binary: the processes with this run's SOAK_OUT.
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), "\x00SOAK_OUT="+out+"\x00") {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			if !zombie(pid) {
				t.Errorf("process %d (%s) of the soak left running", pid, comm(pid))
			}
		}
	}
}

// readStateFile reads a state file's names by kind (pgrp: leader pids).
func readStateFile(t *testing.T, path string) map[string][]string {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) >= 2 {
			out[fs[0]] = append(out[fs[0]], fs[1])
		}
	}
	return out
}

func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

func comm(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(b))
}
