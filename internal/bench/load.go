package bench

import (
	"context"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// NewHTTPClient returns a client that keeps one idle connection per worker,
// so a load run measures Vault and not TCP set-up.
func NewHTTPClient(conns int) *http.Client {
	return &http.Client{
		Timeout: 2 * time.Minute,
		Transport: &http.Transport{
			MaxIdleConns:        conns * 2,
			MaxIdleConnsPerHost: conns * 2,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		},
	}
}

// LoadResult is one closed-loop load run against one URL.
type LoadResult struct {
	Name        string
	Concurrency int
	Duration    time.Duration   // measured part, after the warm-up
	Requests    int             // completed in the measured part
	Total       int             // completed, warm-up included
	Errors      int             // non-200 answers or transport errors
	Latencies   []time.Duration // sorted, successful requests only
	// RoundRPS holds each round's throughput when rounds were merged.
	RoundRPS []float64
}

// RPS is completed requests per second: the median round's when the result
// merges several rounds.
func (r LoadResult) RPS() float64 {
	if len(r.RoundRPS) > 0 {
		return Median(r.RoundRPS)
	}
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Duration.Seconds()
}

// Quantile returns the q-quantile (0..1) of the latencies.
func (r LoadResult) Quantile(q float64) time.Duration {
	return Quantile(r.Latencies, q)
}

// Quantile returns the q-quantile (0..1) of sorted latencies, rounding
// down to a sample that was measured (0 for none).
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}

// Load runs `concurrency` workers, each sending GET url with the token as
// fast as answers come back (closed loop), for warmup and then dur; only
// requests started after the warm-up count.
func Load(ctx context.Context, client *http.Client, name, url, token string, concurrency int, warmup, dur time.Duration) LoadResult {
	start := time.Now()
	measureFrom := start.Add(warmup)
	end := measureFrom.Add(dur)
	type part struct {
		lat   []time.Duration
		errs  int
		n     int
		total int
	}
	parts := make([]part, concurrency)
	var wg sync.WaitGroup
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func(p *part) {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			req.Header.Set("X-Vault-Token", token)
			p.lat = make([]time.Duration, 0, 1<<14)
			for {
				t0 := time.Now()
				if !t0.Before(end) || ctx.Err() != nil {
					return
				}
				resp, err := client.Do(req)
				ok := err == nil && resp.StatusCode == http.StatusOK
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				lat := time.Since(t0)
				p.total++
				if t0.Before(measureFrom) || t0.Add(lat).After(end) {
					continue // warm-up, or finished after the end
				}
				p.n++
				if !ok {
					p.errs++
					continue
				}
				p.lat = append(p.lat, lat)
			}
		}(&parts[w])
	}
	wg.Wait()
	res := LoadResult{Name: name, Concurrency: concurrency, Duration: dur}
	for _, p := range parts {
		res.Requests += p.n
		res.Total += p.total
		res.Errors += p.errs
		res.Latencies = append(res.Latencies, p.lat...)
	}
	slices.Sort(res.Latencies)
	return res
}

// Merge combines rounds of the same load: counts add up, latencies are
// pooled, and throughput is the median round's, so that one round slowed
// by another process on a shared machine does not move the figure.
func Merge(rounds []LoadResult) LoadResult {
	if len(rounds) == 0 {
		return LoadResult{}
	}
	m := LoadResult{Name: rounds[0].Name, Concurrency: rounds[0].Concurrency}
	for _, r := range rounds {
		m.Duration += r.Duration
		m.Requests += r.Requests
		m.Total += r.Total
		m.Errors += r.Errors
		m.Latencies = append(m.Latencies, r.Latencies...)
		m.RoundRPS = append(m.RoundRPS, r.RPS())
	}
	slices.Sort(m.Latencies)
	return m
}

// Median returns the median of v (0 for none).
func Median(v []float64) float64 {
	n := len(v)
	if n == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
