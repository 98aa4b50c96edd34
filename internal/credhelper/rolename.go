package credhelper

import (
	"fmt"
	"regexp"
)

// roleName is the plugin's role-name rule: its roles/<name> and
// creds/<name> paths match a name with framework.GenericNameRegex,
// \w(([\w-.]+)?\w)?, which the helper does not import (it would bring the
// sdk into a small binary); TestCheckRoleIsThePluginsRule holds the two
// together.
var roleName = regexp.MustCompile(`^\w(([\w-.]+)?\w)?$`)

// CheckRole refuses a --role that no role of the plugin can have, before
// anything is sent to Vault: the name is put in a path, so a name such as
// ../../sys/health would read another path, and Vault's answer would then
// blame the mount.
func CheckRole(role string) error {
	if roleName.MatchString(role) {
		return nil
	}
	return fmt.Errorf("--role %q is not a valid role name: a role name is ASCII letters, digits, _, - and ., "+
		"beginning and ending with a letter, digit or _ (app, app-prod, team.app_1), as the plugin's roles/<name> "+
		"takes it; give the name only, not a path (vault list <mount>/roles lists them)", role)
}
