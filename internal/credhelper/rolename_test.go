package credhelper

import (
	"regexp"
	"testing"

	"github.com/hashicorp/vault/sdk/framework"
)

// TestCheckRoleIsThePluginsRule: the helper refuses exactly the names that
// the plugin's paths do not match (framework.GenericNameRegex).
func TestCheckRoleIsThePluginsRule(t *testing.T) {
	plugin := regexp.MustCompile("^" + framework.GenericNameRegex("name") + "$")
	for _, name := range []string{"app", "a", "_", "app-prod", "team.app_1", "A9", "a-", "-a", "a.", ".a", "a b",
		"../../sys/health", "a/b", "", "é", "app\n", "a..b", "a--b", "x_"} {
		if got, want := CheckRole(name) == nil, plugin.MatchString(name); got != want {
			t.Errorf("%q: helper accepts %v, plugin accepts %v", name, got, want)
		}
	}
}
