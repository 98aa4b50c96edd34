package plugin

import "strings"

// entitySep is used in this file: entity.go counts for the entity key.
const entitySep = "/"

func entityKey(role, id string) string { return role + entitySep + id }

func splitKey(key string) (role, id string) {
	role, id, _ = strings.Cut(key, entitySep)
	return role, id
}

func roleOf(key string) string {
	r, _ := splitKey(key)
	return r
}
