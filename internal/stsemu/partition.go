package stsemu

import (
	"fmt"
	"sort"
	"strings"
)

// Partition is an AWS partition as the emulator plays it: the name ARNs
// carry (arn:PARTITION:iam::...), and IAM's endpoint and the only region
// IAM accepts in a signature's scope. IAM is global within a partition: each
// partition has one IAM endpoint, signed for one region.
type Partition struct {
	Name      string `json:"name"`
	IAMRegion string `json:"iam_region"`
	// IAMHost is the host of the partition's IAM endpoint.
	IAMHost string `json:"iam_host"`
}

// The partitions, with IAM's endpoints as AWS documents them ("AWS Identity
// and Access Management endpoints and quotas"; GovCloud and China user
// guides).
var partitions = map[string]Partition{
	"aws":        {Name: "aws", IAMRegion: "us-east-1", IAMHost: "iam.amazonaws.com"},
	"aws-us-gov": {Name: "aws-us-gov", IAMRegion: "us-gov-west-1", IAMHost: "iam.us-gov.amazonaws.com"},
	"aws-cn":     {Name: "aws-cn", IAMRegion: "cn-north-1", IAMHost: "iam.cn-north-1.amazonaws.com.cn"},
}

// DefaultPartition is the partition an Emulator plays unless
// Config.Partition names another.
const DefaultPartition = "aws"

// LookupPartition returns the partition of that name ("aws", "aws-us-gov"
// or "aws-cn"); "" is the default.
func LookupPartition(name string) (Partition, error) {
	if name == "" {
		name = DefaultPartition
	}
	p, ok := partitions[name]
	if !ok {
		return Partition{}, fmt.Errorf("unknown partition %q: want one of %s", name, strings.Join(PartitionNames(), ", "))
	}
	return p, nil
}

// PartitionNames lists the partitions the emulator knows, sorted.
func PartitionNames() []string {
	names := make([]string, 0, len(partitions))
	for n := range partitions {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// partitionOfHost returns the partition whose IAM endpoint host is host
// (a port ignored): a request addressed to another partition's IAM host
// (through a proxy or a rewritten resolver) meets a directory where the
// emulator's keys do not exist.
func partitionOfHost(host string) (Partition, bool) {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	host = strings.ToLower(host)
	for _, p := range partitions {
		if p.IAMHost == host {
			return p, true
		}
	}
	return Partition{}, false
}

// Partition returns the partition the emulator plays.
func (e *Emulator) Partition() Partition { return e.partition }
