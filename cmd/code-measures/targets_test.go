package main

import (
	"testing"
)

// TestPluginMeetsTheTargets measures the plugin package itself against the
// targets of the "Owners, not a god object" issue, so that a change (or a
// merge) that brings back a field touched from everywhere, a long parameter
// list or a second place that joins entity keys fails the test command
// instead of waiting for someone to run `make measures`.
func TestPluginMeetsTheTargets(t *testing.T) {
	p, err := loadPackage("../..")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.typeErrs) > 0 {
		t.Fatalf("the plugin does not type-check: %v", p.typeErrs)
	}
	ms, err := run(p, "../..", pluginConfig)
	if err != nil {
		t.Fatal(err)
	}
	// The "after" column: at most (or, for the last, at least)
	// this much.
	targets := map[string]struct {
		limit   int
		atLeast bool
	}{
		"backend_fields":                         {16, false},
		"fields_touched_from_3plus_files":        {3, false},
		"files_taking_store_lock":                {1, false},
		"files_calling_logical_storage":          {2, false},
		"files_split_or_join_entity_key":         {2, false},
		"funcs_over_5_params":                    {0, false},
		"funcs_with_2plus_bool_params":           {0, false},
		"funcs_cyclomatic_over_30":               {0, false},
		"fake_clocks":                            {1, false},
		"mechanisms_unit_tested_without_backend": {5, true},
	}
	if len(ms) != len(targets) {
		t.Fatalf("%d measures, %d targets", len(ms), len(targets))
	}
	for _, m := range ms {
		target, ok := targets[m.Name]
		switch {
		case !ok:
			t.Errorf("%s: no target", m.Name)
		case target.atLeast && m.Value < target.limit:
			t.Errorf("%s = %d, want at least %d: %q", m.Name, m.Value, target.limit, m.Items)
		case !target.atLeast && m.Value > target.limit:
			t.Errorf("%s = %d, want at most %d: %q", m.Name, m.Value, target.limit, m.Items)
		}
	}
}
