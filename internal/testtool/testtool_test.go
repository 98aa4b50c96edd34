package testtool

import (
	"slices"
	"strings"
	"testing"
)

func TestEnvDropsPrefixesAndAppends(t *testing.T) {
	t.Setenv("AWS_SECRET_ACCESS_KEY", "from-the-developer")
	t.Setenv("VAULT_TOKEN", "from-the-developer")
	t.Setenv("TESTTOOL_KEPT", "yes")
	env := Env([]string{"AWS_", "VAULT_"}, "AWS_REGION=us-east-1")
	for _, kv := range env {
		if strings.HasPrefix(kv, "VAULT_") || (strings.HasPrefix(kv, "AWS_") && kv != "AWS_REGION=us-east-1") {
			t.Errorf("Env kept %q", kv)
		}
	}
	if !slices.Contains(env, "TESTTOOL_KEPT=yes") {
		t.Error("Env dropped a variable no prefix names")
	}
	if env[len(env)-1] != "AWS_REGION=us-east-1" {
		t.Errorf("Env's last entry is %q, want the extra one", env[len(env)-1])
	}
}

func TestRequireFindsAWorkingTool(t *testing.T) {
	if got := Require(t, "sh", "-c", "exit 0"); !strings.HasSuffix(got, "/sh") {
		t.Errorf("Require(sh) = %q", got)
	}
}

// fakeTB records what Require does to a test without ending this one.
type fakeTB struct {
	testing.TB
	skipped, failed bool
}

func (f *fakeTB) Helper()               {}
func (f *fakeTB) Logf(string, ...any)   {}
func (f *fakeTB) Skipf(string, ...any)  { f.skipped = true }
func (f *fakeTB) Fatalf(string, ...any) { f.failed = true }

func TestRequireSkipsLocallyAndFailsInCI(t *testing.T) {
	for _, tc := range []struct {
		name, ci    string
		prog        string
		check       []string
		skip, fatal bool
	}{
		{name: "missing, local", prog: "testtool-no-such-program", skip: true},
		{name: "missing, CI", ci: "true", prog: "testtool-no-such-program", fatal: true},
		{name: "check fails, local", prog: "sh", check: []string{"-c", "exit 3"}, skip: true},
		{name: "check fails, CI", ci: "true", prog: "sh", check: []string{"-c", "exit 3"}, fatal: true},
		{name: "works, CI", ci: "true", prog: "sh", check: []string{"-c", "exit 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			f := &fakeTB{}
			Require(f, tc.prog, tc.check...)
			if f.skipped != tc.skip || f.failed != tc.fatal {
				t.Errorf("skipped %v, failed %v; want %v, %v", f.skipped, f.failed, tc.skip, tc.fatal)
			}
		})
	}
}
