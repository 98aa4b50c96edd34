package main

import (
	"net/http"
	"sync"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// haDueLifetimes are the lifetimes of the credentials that fall due in the
// minute after the failover, with refresh_fraction 0.5: due 15 to 55 s
// after they were issued, which is just before the SIGKILL, and expiring 30
// to 110 s after it. The shortest expire within the minute unless the new
// active node refreshes them.
var haDueLifetimes = []time.Duration{110 * time.Second, 90 * time.Second, 70 * time.Second, 50 * time.Second, 30 * time.Second}

// scaleHA: a 3-node raft cluster (internal/vaulttest, as scripts/ha.sh
// builds by hand) with -roles roles cached, then SIGKILL of the active
// node. A twentieth of the roles (20 to 500) are cached with short
// credentials just before the kill, so that they fall due in the minute
// after it; every other role is planned hours out. Two readers, one per surviving node,
// read a sample of roles throughout and check every credential served.
func (r *run) scaleHA(sr *scaleRun) *haResult {
	tb := r.tb
	n := sr.n
	res := &haResult{Roles: n, ScheduledSecs: -1, LogSecs: -1}
	r.logf("f: HA: starting a 3-node raft cluster")
	c := vaulttest.StartCluster(tb, vaulttest.ClusterOptions{LogLevel: "info"})
	defer func() {
		for _, s := range c.Running() {
			s.Stop(tb)
		}
	}()
	c.SetupPlugin(tb, vaulttest.DefaultPluginVersion, r.scalePluginEnv()...)
	active := c.WaitActive(tb, time.Minute)
	a := newAPI(active)
	emu := vaulttest.StartEmulator(tb)
	defer emu.Process.Stop(5 * time.Second)
	mount := vaulttest.MountPath
	must(tb, a.write(mount+"/config/root", map[string]any{
		"access_key": emu.AccessKey, "secret_key": emu.SecretKey, "region": "us-east-1", "sts_endpoint": emu.URL,
	}))
	must(tb, a.write(mount+"/config/refresh", map[string]any{
		"retry_window": 6, "max_retries": 6, "sts_rate_limit": 0, "refresh_fraction": 0.05, "metrics_max_roles": 0,
	}))
	// The roles due in the minute are the last k, created with the others
	// and cached last (new roles: the plugin refuses a credential that
	// expires before the one it has cached).
	k := min(max(n/20, 20), 500)
	due := sr.names[n-k:]
	t0 := time.Now()
	create, warm := r.scaleFill(a, mount, sr.names[:n-k])
	r.scaleCreate(a, mount, due)
	res.FillSecs = time.Since(t0).Seconds()
	r.logf("f: HA: %d roles created in %.1fs, %d cached in %.1fs through %s (active)", n, create.Seconds(), n-k, warm.Seconds(), active.NodeID())

	// Longest lifetimes first, so that the shortest are issued last, just
	// before the kill.
	nexts := make([]time.Time, k)
	must(tb, a.write(mount+"/config/refresh", map[string]any{"refresh_fraction": 0.5}))
	groups := len(haDueLifetimes)
	for g, life := range haDueLifetimes {
		emu.SetConfig(tb, map[string]any{"max_lifetime": life.String()})
		lo, hi := g*k/groups, (g+1)*k/groups
		must(tb, parallel(hi-lo, 16, func(i int) error {
			var err error
			_, nexts[lo+i], err = a.refreshRole(mount, due[lo+i])
			return err
		}))
	}
	// Their next refresh (and every other) fetches a 12 h credential.
	must(tb, a.write(mount+"/config/refresh", map[string]any{"refresh_fraction": 0.05}))
	emu.SetConfig(tb, map[string]any{"max_lifetime": scaleLongTTL.String()})

	// Readers: the roles due and as many others, through each standby.
	sample := append([]string{}, due...)
	sample = append(sample, sr.names[:k]...)
	survivors := c.Standbys(active)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var reads []haRead
	for i, s := range survivors {
		ra := &api{addr: s.Addr, token: s.RootToken(), c: &http.Client{Timeout: 5 * time.Second}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := haReader(ra, mount, sample, i, stop)
			mu.Lock()
			reads = append(reads, got...)
			mu.Unlock()
		}()
	}
	time.Sleep(2 * time.Second)

	kill := time.Now()
	active.Kill(tb)
	var newActive *vaulttest.Server
	health := &http.Client{Timeout: 2 * time.Second}
	for newActive == nil {
		for _, s := range survivors {
			if resp, err := health.Get(s.Addr + "/v1/sys/health"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					newActive = s
				}
			}
		}
		if newActive == nil {
			if time.Since(kill) > 2*time.Minute {
				close(stop)
				wg.Wait()
				tb.Fatalf("f: HA: no new active node within 2 minutes of the SIGKILL")
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
	elected := time.Now()
	res.ElectionSecs = elected.Sub(kill).Seconds()
	r.logf("f: HA: SIGKILL of %s; %s active after %.2fs", active.NodeID(), newActive.NodeID(), res.ElectionSecs)
	na := newAPI(newActive)
	res.Gauge = waitScheduled(na, mount, n, elected, 5*time.Minute)
	res.ScheduledSecs = res.Gauge.Secs
	// The new active node may log its start before sys/health answers 200.
	end := elected.Add(time.Minute)
	res.Log = startLogAfter(newActive.Process.LogPath, elected.Add(-5*time.Second), max(10*time.Second, time.Until(end)))
	for _, v := range []*float64{&res.Log.IndexSecs, &res.Log.PassSecs} {
		if *v >= 0 {
			// Logged before sys/health answered: counted as at the election.
			*v = max(0, *v-5)
		}
	}
	res.LogSecs = res.Log.allScheduled(n)
	time.Sleep(time.Until(end))
	close(stop)
	wg.Wait()
	if pm, err := bench.ReadMem(r.scalePID(newActive)); err == nil {
		res.PluginRSS = pm.RSS
	}

	// The minute's STS calls against the roles due in it.
	dueSet := map[string]bool{}
	for i, name := range due {
		if nexts[i].After(end) {
			continue
		}
		if !nexts[i].After(kill) {
			res.DueBeforeKill++
		}
		dueSet[roleARN(name)] = true
	}
	res.Due = len(dueSet)
	okBy := map[string]int{}
	for _, cl := range emu.Calls(tb) {
		if cl.Action != "AssumeRole" || cl.Time.Before(kill) || cl.Time.After(end) {
			continue
		}
		res.Calls++
		if !dueSet[cl.RoleArn] {
			res.NotDue++
		}
		if cl.Outcome == "ok" {
			res.CallsOK++
			okBy[cl.RoleArn]++
		}
	}
	for arn, c := range okBy {
		if dueSet[arn] {
			res.DueRefreshed++
		}
		res.Duplicates += max(0, c-1)
	}
	r.summarizeReads(res, reads, kill)
	r.logf("f: HA: every role scheduled %s after the election (first gauge read answered %s showing %d; per the log %s: %s); minute after: %d roles due (%d before the kill), %d STS calls (%d ok), %d due roles refreshed, %d duplicates, %d for roles not due; reads %d, errors %d, expired %d, longest outage %.2fs; new active plugin RSS %s",
		secs(res.ScheduledSecs), secs(res.Gauge.FirstSecs), res.Gauge.FirstValue, secs(res.LogSecs), res.Log.describe(), res.Due, res.DueBeforeKill, res.Calls, res.CallsOK, res.DueRefreshed, res.Duplicates, res.NotDue,
		res.Reads, res.ReadErrors, res.Expired, res.ReadOutageSecs, mib(res.PluginRSS))
	return res
}

// haRead is one read of the HA readers.
type haRead struct {
	reader  int
	at      time.Time // when the answer came
	ok      bool
	expired bool
}

// haReader reads creds of the sample in turn, one read every 25 ms, until
// stop is closed. A credential counts as expired when its expiration (whole
// seconds: the creds answer truncates it) is a full second before the
// answer came, so an expiration rounded down is never taken for one.
func haReader(a *api, mount string, sample []string, id int, stop <-chan struct{}) []haRead {
	var out []haRead
	for k := 0; ; k++ {
		select {
		case <-stop:
			return out
		default:
		}
		s, err := a.read(mount + "/creds/" + sample[k%len(sample)])
		rd := haRead{reader: id, at: time.Now(), ok: err == nil}
		if err == nil {
			es, _ := s.Data["expiration"].(string)
			exp, perr := time.Parse(time.RFC3339, es)
			rd.expired = perr != nil || !exp.Add(time.Second).After(rd.at)
		}
		out = append(out, rd)
		time.Sleep(25 * time.Millisecond)
	}
}

// summarizeReads counts the readers' reads, errors and expired credentials,
// and the longest time a reader went without a successful read after kill.
func (r *run) summarizeReads(res *haResult, reads []haRead, kill time.Time) {
	last := map[int]time.Time{}
	for _, rd := range reads {
		res.Reads++
		if !rd.ok {
			res.ReadErrors++
			continue
		}
		if rd.expired {
			res.Expired++
		}
		prev, seen := last[rd.reader]
		if !seen || prev.Before(kill) {
			prev = kill
		}
		if rd.at.After(kill) {
			res.ReadOutageSecs = max(res.ReadOutageSecs, rd.at.Sub(prev).Seconds())
		}
		last[rd.reader] = rd.at
	}
}
