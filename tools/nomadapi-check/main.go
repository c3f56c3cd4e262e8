// nomadapi-check decodes rendered nomadtf jobs into the job structs of Nomad's own API
// module, refusing any field those structs do not have, and lints what a Nomad of the
// target version accepts but ignores or no longer does.
//
// Nomad 1.7 and later are not open source and are never run by this project; their
// MPL-2.0 `github.com/hashicorp/nomad/api` module is the closest thing to the server's
// decoder we may use: the HTTP API decodes a registration into these structs with
// encoding/json, so a field nomadtf sends that is not there is a field Nomad drops.
//
// Usage:
//
//	nomadapi-check -target 2.0.5 job1.json job2.json ...
//
// Each file is what `nomadtf render --nomad-version 2.0.5` prints (a JobRegisterRequest:
// {"Job": {...}}). Exit 0: every file decodes and lints clean; 1: a problem (each on its
// own line, prefixed with the file); 2: bad arguments.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/api"
)

type version struct{ major, minor, patch int }

func (v version) atLeast(o version) bool {
	if v.major != o.major {
		return v.major > o.major
	}
	if v.minor != o.minor {
		return v.minor > o.minor
	}
	return v.patch >= o.patch
}

func parseVersion(text string) (version, error) {
	parts := strings.SplitN(strings.TrimPrefix(text, "v"), ".", 3)
	if len(parts) < 2 {
		return version{}, fmt.Errorf("not a version: %q", text)
	}
	var nums [3]int
	for i, part := range parts {
		n, err := strconv.Atoi(strings.SplitN(part, "-", 2)[0])
		if err != nil {
			return version{}, fmt.Errorf("not a version: %q", text)
		}
		nums[i] = n
	}
	return version{nums[0], nums[1], nums[2]}, nil
}

var (
	v1_7  = version{1, 7, 0}
	v1_8  = version{1, 8, 0}
	v1_10 = version{1, 10, 0}
)

// consulFunctions: the consul-template functions that query Consul.
var consulFunctions = regexp.MustCompile(`\{\{-?\s*(range\s+|with\s+)?(service|services|key|keyOrDefault|keyExists|ls|safeLs|tree|safeTree|connect|caRoots|caLeaf|node|nodes)\s`)

// decode reads one registration strictly: unknown fields and trailing data are errors.
func decode(data []byte) (*api.JobRegisterRequest, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var req api.JobRegisterRequest
	if err := dec.Decode(&req); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("data after the job")
	}
	if req.Job == nil {
		return nil, fmt.Errorf("no Job")
	}
	return &req, nil
}

func hasIdentity(task *api.Task, name, audience string) bool {
	for _, id := range task.Identities {
		if id == nil || id.Name != name {
			continue
		}
		for _, aud := range id.Audience {
			if aud == audience {
				return true
			}
		}
	}
	return false
}

// lint: what a Nomad at `target` accepts without an error and then ignores, or refuses.
func lint(job *api.Job, target version) []string {
	var problems []string
	for _, group := range job.TaskGroups {
		where := fmt.Sprintf("group %q", deref(group.Name))
		if target.atLeast(v1_8) {
			if group.MaxClientDisconnect != nil {
				problems = append(problems, where+": max_client_disconnect is deprecated from 1.8 and ignored from 1.10; use disconnect.lost_after")
			}
			if group.StopAfterClientDisconnect != nil {
				problems = append(problems, where+": stop_after_client_disconnect is deprecated from 1.8 and ignored from 1.10; use disconnect.stop_on_client_after")
			}
			if group.PreventRescheduleOnLost != nil {
				problems = append(problems, where+": prevent_reschedule_on_lost is deprecated from 1.8 and ignored from 1.10; use disconnect.replace")
			}
		}
		for _, task := range group.Tasks {
			at := fmt.Sprintf("%s task %q", where, task.Name)
			if task.Vault != nil && target.atLeast(v1_10) {
				if len(task.Vault.Policies) > 0 {
					problems = append(problems, at+": vault.policies is kept in the API and dropped silently by Nomad 1.10+ (no token workflow); use vault.role")
				}
				if task.Vault.Role == "" {
					problems = append(problems, at+": vault block without a role: the task's token would come from the auth method's default role, not the job's")
				}
			}
			if task.Vault != nil && target.atLeast(v1_7) && len(task.Vault.Policies) == 0 && !hasIdentity(task, "vault_default", "vault.io") {
				problems = append(problems, at+": vault block without a vault_default identity (audience vault.io)")
			}
			if target.atLeast(v1_10) && task.Consul == nil && group.Consul == nil {
				for _, tmpl := range task.Templates {
					if tmpl.EmbeddedTmpl != nil && consulFunctions.MatchString(*tmpl.EmbeddedTmpl) {
						problems = append(problems, fmt.Sprintf("%s: template %s reads Consul but the task has no consul block (Nomad 1.10+ renders it with the task's Consul identity)", at, deref(tmpl.DestPath)))
					}
				}
			}
		}
	}
	return problems
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func check(path string, target version) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return []string{err.Error()}
	}
	req, err := decode(data)
	if err != nil {
		return []string{"does not decode into api.JobRegisterRequest: " + err.Error()}
	}
	problems := lint(req.Job, target)
	req.Job.Canonicalize() // the client library's own defaults apply without a panic
	return problems
}

func main() {
	targetText := flag.String("target", "2.0.5", "the Nomad version the jobs were rendered for")
	flag.Parse()
	target, err := parseVersion(*targetText)
	if err != nil || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: nomadapi-check -target 2.0.5 JOB.json ...")
		os.Exit(2)
	}
	failed := false
	for _, path := range flag.Args() {
		problems := check(path, target)
		for _, problem := range problems {
			fmt.Printf("%s: %s\n", path, problem)
		}
		if len(problems) > 0 {
			failed = true
		} else {
			fmt.Printf("%s: ok\n", path)
		}
	}
	if failed {
		os.Exit(1)
	}
}
