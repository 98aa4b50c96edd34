package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(t *testing.T, o options)
		wantErr bool
		says    string // words the error carries
	}{
		{name: "defaults", args: nil, check: func(t *testing.T, o options) {
			want := options{listen: "127.0.0.1:8599", cfg: stsemu.Config{
				Account: "123456789012", AccessKey: stsemu.DefaultAccessKey, SecretKey: stsemu.DefaultSecretKey,
				MaxLifetime: 12 * time.Hour, Partition: "aws", SkewTolerance: 5 * time.Minute,
			}}
			if !reflect.DeepEqual(o, want) {
				t.Errorf("got %+v, want %+v", o, want)
			}
		}},
		{name: "everything", args: []string{
			"-listen", "127.0.0.1:0", "-account", "210987654321", "-access-key", "AKIAOTHER", "-secret-key", "s3cr3t",
			"-max-lifetime", "30s", "-rate", "2.5", "-burst", "4", "-latency", "10ms-50ms",
			"-faults", "Throttling:2,reset=0.5,hang=1s,match=app", "-deny", "bad-*, arn:aws:iam::*:role/x", "-quiet",
			"-iam-inconsistency", "3s", "-iam-inconsistency-refusal", "0.25", "-iam-revocation", "2s", "-seed", "9", "-partition", "aws-us-gov",
			"-iam-refuse-first", "3", "-clock-offset", "-4m", "-skew-tolerance", "15m",
		}, check: func(t *testing.T, o options) {
			want := options{listen: "127.0.0.1:0", quiet: true, cfg: stsemu.Config{
				Account: "210987654321", AccessKey: "AKIAOTHER", SecretKey: "s3cr3t", MaxLifetime: 30 * time.Second,
				Rate: 2.5, Burst: 4, LatencyMin: 10 * time.Millisecond, LatencyMax: 50 * time.Millisecond,
				Deny:       []string{"bad-*", "arn:aws:iam::*:role/x"},
				IAMWindows: stsemu.IAMWindows{Inconsistency: 3 * time.Second, Refusal: 0.25, Revocation: 2 * time.Second, RefuseFirst: 3},
				Seed:       9, Partition: "aws-us-gov", ClockOffset: -4 * time.Minute, SkewTolerance: 15 * time.Minute,
			}, faults: stsemu.FaultPlan{
				Sequence:    []stsemu.FaultStep{{Fault: stsemu.FaultThrottling, Count: 2}},
				Probability: map[stsemu.Fault]float64{stsemu.FaultReset: 0.5},
				Hang:        time.Second, Match: "app",
			}}
			if !reflect.DeepEqual(o, want) {
				t.Errorf("got %+v\nwant %+v", o, want)
			}
		}},
		{name: "also listen", args: []string{"-also-listen", "127.0.0.1:0, 127.0.0.1:8600", "-also-listen", "[::1]:0"}, check: func(t *testing.T, o options) {
			if want := []string{"127.0.0.1:0", "127.0.0.1:8600", "[::1]:0"}; !reflect.DeepEqual(o.also, want) {
				t.Errorf("also %q, want %q", o.also, want)
			}
		}},
		{name: "fixed latency", args: []string{"-latency", "50ms"}, check: func(t *testing.T, o options) {
			if o.cfg.LatencyMin != 50*time.Millisecond || o.cfg.LatencyMax != 50*time.Millisecond {
				t.Errorf("latency %v-%v, want 50ms-50ms", o.cfg.LatencyMin, o.cfg.LatencyMax)
			}
		}},
		{name: "JSON faults", args: []string{"-faults", `{"sequence":[{"fault":"malformed","count":1}]}`}, check: func(t *testing.T, o options) {
			if len(o.faults.Sequence) != 1 || o.faults.Sequence[0].Fault != stsemu.FaultMalformed {
				t.Errorf("faults %+v", o.faults)
			}
		}},
		{name: "bad latency", args: []string{"-latency", "50ms-10ms"}, wantErr: true},
		{name: "unparsable latency", args: []string{"-latency", "fast"}, wantErr: true},
		{name: "unknown fault", args: []string{"-faults", "Explode:1"}, wantErr: true},
		{name: "zero skew tolerance", args: []string{"-skew-tolerance", "0s"}, wantErr: true},
		{name: "unparsable clock offset", args: []string{"-clock-offset", "soon"}, wantErr: true},
		{name: "unknown partition", args: []string{"-partition", "aws-iso"}, wantErr: true},
		{name: "refusal above 1", args: []string{"-iam-inconsistency-refusal", "1.5"}, wantErr: true},
		{name: "negative revocation", args: []string{"-iam-revocation", "-1s"}, wantErr: true},
		{name: "negative refuse-first", args: []string{"-iam-refuse-first", "-1"}, wantErr: true},
		{name: "negative rate", args: []string{"-rate", "-1"}, wantErr: true},
		{name: "zero max lifetime", args: []string{"-max-lifetime", "0s"}, wantErr: true},
		{name: "unknown flag", args: []string{"-nope"}, wantErr: true, says: "flag provided but not defined: -nope; sts-emulator -h lists the flags"},
		// Issue 45, item 11: a flag error says what to do.
		{name: "mistyped flag", args: []string{"-lisen", "127.0.0.1:0"}, wantErr: true, says: "-lisen (did you mean -listen?); sts-emulator -h lists the flags"},
		{name: "misspelt flag", args: []string{"-acount", "123456789012"}, wantErr: true, says: "-acount (did you mean -account or -accounts?)"},
		{name: "bad duration", args: []string{"-max-lifetime", "an hour"}, wantErr: true, says: "(-max-lifetime: cap on the lifetime of issued credentials"},
		{name: "missing value", args: []string{"-rate"}, wantErr: true, says: "flag needs an argument: -rate (-rate: token-bucket throttling in requests/s;"},
		// Issue 45, item 6: -account is checked as -accounts is.
		{name: "short account", args: []string{"-account", "12345"}, wantErr: true, says: `-account: account "12345" is not a 12-digit account id`},
		{name: "short accounts", args: []string{"-accounts", "12345"}, wantErr: true, says: `account "12345" is not a 12-digit account id`},
		{name: "account with letters", args: []string{"-account", "12345678901a"}, wantErr: true, says: "-account: "},
		{name: "stray argument", args: []string{"extra"}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, io.Discard)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if err != nil {
				if !errors.As(err, new(usageError)) {
					t.Errorf("err %v is not a usageError (exit status 2)", err)
				}
				if !strings.Contains(err.Error(), tc.says) {
					t.Errorf("err %q does not say %q", err, tc.says)
				}
				return
			}
			tc.check(t, o)
		})
	}
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	_, err := parseFlags([]string{"-h"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{
		"-listen", "-account", "-access-key", "-secret-key", "-max-lifetime", "-rate", "-burst", "-latency",
		"-faults", "-deny", "-quiet", "127.0.0.1:8599", "123456789012", "AKIAIOSFODNN7EXAMPLE",
		"/_emulator/stats", "/_emulator/faults", "Throttling", "empty_key", "match=STR",
		"-also-listen", "/_emulator/listeners", "refused", "unavailable",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h output lacks %q", want)
		}
	}
	for _, f := range stsemu.AllFaults() {
		if !regexp.MustCompile(`(^|\W)` + string(f) + `(\W|$)`).MatchString(out.String()) {
			t.Errorf("-h output does not document the fault %s", f)
		}
	}
}

// lineWriter hands the first line written to it to a channel.
type lineWriter struct {
	buf   bytes.Buffer
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line) // incomplete: keep for the next write
			return len(p), nil
		}
		w.lines <- strings.TrimSpace(line)
	}
}

// listeningURL extracts the URL from the announcement line.
func listeningURL(t *testing.T, line string) string {
	t.Helper()
	url, ok := strings.CutPrefix(line, "sts-emulator listening on ")
	if !ok || !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("first stdout line %q, want %q", line, "sts-emulator listening on http://127.0.0.1:PORT")
	}
	return url
}

// callerArn calls GetCallerIdentity on url with the default root pair.
func callerArn(url string) (string, error) {
	client := sts.New(sts.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(url),
		Credentials:  credentials.NewStaticCredentialsProvider(stsemu.DefaultAccessKey, stsemu.DefaultSecretKey, ""),
		Retryer:      aws.NopRetryer{},
	})
	out, err := client.GetCallerIdentity(context.Background(), &sts.GetCallerIdentityInput{})
	if err != nil {
		return "", err
	}
	return aws.ToString(out.Arn), nil
}

// running is run, started in a goroutine of its own by startRun.
type running struct {
	stdout *lineWriter
	stderr *syncBuffer
	done   chan error
}

// startRun starts run with args until ctx ends.
func startRun(ctx context.Context, args ...string) *running {
	r := &running{stdout: &lineWriter{lines: make(chan string, 4)}, stderr: &syncBuffer{}, done: make(chan error, 1)}
	go func() { r.done <- run(ctx, args, r.stdout, r.stderr) }()
	return r
}

// line returns run's next line on stdout; t fails if run returns first or
// no line comes within 10 s.
func (r *running) line(t *testing.T) string {
	t.Helper()
	select {
	case line := <-r.stdout.lines:
		return line
	case err := <-r.done:
		t.Fatalf("run returned early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no line on stdout within 10 s")
	}
	return ""
}

func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := startRun(ctx, "-listen", "127.0.0.1:0", "-faults", "AccessDenied:1")
	url := listeningURL(t, r.line(t))

	// The -faults plan is in force from the start.
	_, err := callerArn(url)
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "AccessDenied" {
		t.Errorf("first call: %v, want the AccessDenied fault from -faults", err)
	}
	if arn, err := callerArn(url); err != nil || arn != "arn:aws:iam::123456789012:user/sts-emulator" {
		t.Errorf("second call: %q, %v", arn, err)
	}

	cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("run after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop after cancel")
	}
	logged := r.stderr.String()
	if strings.Count(logged, "action=GetCallerIdentity") != 2 || !strings.Contains(logged, "outcome=AccessDenied") {
		t.Errorf("stderr log:\n%s\nwant one line per call", logged)
	}
	if strings.Contains(logged, stsemu.DefaultSecretKey) {
		t.Error("stderr log contains the secret key")
	}
	select {
	case extra := <-r.stdout.lines:
		t.Errorf("stdout has more than the listening line: %q", extra)
	default:
	}
}

// TestRunAlsoListen: -also-listen serves the same emulator on another
// address, announced before the listening line; taking the first down
// through the second leaves the second serving, and the log names the
// listener of every call.
func TestRunAlsoListen(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := startRun(ctx, "-listen", "127.0.0.1:0", "-also-listen", "127.0.0.1:0")
	lines := []string{r.line(t), r.line(t)}
	second, ok := strings.CutPrefix(lines[0], "sts-emulator also listening on ")
	if !ok {
		t.Fatalf("first line %q, want the -also-listen announcement", lines[0])
	}
	primary := listeningURL(t, lines[1])
	for _, u := range []string{primary, second} {
		if _, err := callerArn(u); err != nil {
			t.Fatalf("GetCallerIdentity through %s: %v", u, err)
		}
	}
	body := strings.NewReader(`{"addr":"` + primary + `","state":"refused"}`)
	resp, err := http.Post(second+"/_emulator/listeners", "application/json", body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("refusing the first listener through the second: %v %v", resp, err)
	}
	resp.Body.Close()
	if _, err := callerArn(primary); err == nil {
		t.Error("the refused listener answered")
	}
	if _, err := callerArn(second); err != nil {
		t.Errorf("the second listener during the outage: %v", err)
	}
	cancel()
	if err := <-r.done; err != nil {
		t.Errorf("run after cancel: %v", err)
	}
	logged := r.stderr.String()
	for _, u := range []string{primary, second} {
		if !strings.Contains(logged, "listener="+strings.TrimPrefix(u, "http://")) {
			t.Errorf("the log names no call through %s:\n%s", u, logged)
		}
	}
}

func TestRunListenError(t *testing.T) {
	err := run(context.Background(), []string{"-listen", "256.0.0.1:1"}, io.Discard, io.Discard)
	if err == nil {
		t.Fatal("want an error for an unusable -listen address")
	}
}

// TestBinary builds the real binary, waits for its listening line, makes a
// call and stops it with SIGTERM, as the scripts do.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	bin := filepath.Join(t.TempDir(), "sts-emulator")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-listen", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }() // only if a check below failed first

	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var url string
	select {
	case line := <-lines:
		url = listeningURL(t, line)
	case <-time.After(30 * time.Second):
		t.Fatalf("no listening line; stderr:\n%s", stderr.String())
	}
	if arn, err := callerArn(url); err != nil || arn != "arn:aws:iam::123456789012:user/sts-emulator" {
		t.Fatalf("GetCallerIdentity: %q, %v", arn, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("binary did not exit after SIGTERM")
	}
}
