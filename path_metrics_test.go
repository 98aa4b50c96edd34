package awsresilient

import (
	"context"
	"runtime"
	rtmetrics "runtime/metrics"
	"strings"
	"testing"

	"github.com/hashicorp/vault/sdk/logical"
)

// TestReturnHeadroomGivesPagesBack: ending the last scrape's headroom hold
// gives the pages its copies took back to the OS at once (returnHeadroom),
// rather than leave RSS up for the next 10 s or more; while another scrape
// still holds headroom the pages stay, for it to use. Each call ends its
// hold.
func TestReturnHeadroomGivesPagesBack(t *testing.T) {
	released := func() uint64 {
		s := []rtmetrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
		rtmetrics.Read(s)
		return s[0].Value.Uint64()
	}
	// 64 MiB of copies, as a scrape of 10 000 roles with per-role series
	// leaves, touched so that their pages are resident, then garbage.
	garbage := func() {
		copies := make([]byte, 64<<20)
		for i := 0; i < len(copies); i += 4096 {
			copies[i] = 1
		}
		runtime.KeepAlive(copies)
	}
	ended := 0
	release := func() { ended++ }
	scrapesHolding.Add(2) // two scrapes, one after the other
	garbage()
	runtime.GC() // collected, not yet given back
	before := released()
	returnHeadroom(release)
	if got := released() - before; ended != 1 || got >= 32<<20 {
		t.Fatalf("first of two scrapes: hold ended %d times, %d MiB given back; want it ended, and the pages kept for the other", ended, got>>20)
	}
	garbage()
	before = released()
	returnHeadroom(release)
	if got := released() - before; ended != 2 || got < 32<<20 {
		t.Fatalf("last scrape: hold ended %d times, %d MiB given back to the OS; want it ended and most of the 64 MiB given back", ended, got>>20)
	}
}

// TestMetricsHelpSaysHowToReadByHand (issue 32, item 16): a plain `vault
// read <mount>/metrics` fails with Go's JSON error, which the plugin cannot
// change (the CLI and Prometheus send the same request); the path's help,
// which `vault path-help` shows, says how to read the page by hand.
func TestMetricsHelpSaysHowToReadByHand(t *testing.T) {
	b, s := getTestBackend(t)
	resp, err := b.HandleRequest(context.Background(), &logical.Request{Operation: logical.HelpOperation, Path: "metrics", Storage: s})
	if err != nil {
		t.Fatal(err)
	}
	help, _ := resp.Data["help"].(string)
	for _, want := range []string{"vault read -format=raw <mount>/metrics", "invalid character '#' looking for beginning of value"} {
		if !strings.Contains(help, want) {
			t.Errorf("metrics help does not say %q:\n%s", want, help)
		}
	}
}
