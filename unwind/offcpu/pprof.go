package offcpu

import (
	"io"

	"github.com/google/pprof/profile"
)

// Pprof converts the profile for `go tool pprof`: one pprof sample per
// stack with two values (samples or blocks, and off-CPU nanoseconds, the
// default), frames innermost first ending in the group frame, and the
// thread state, wait channel, pid and tid as labels. o selects frames as
// for Folded (Delimiter and State are folded-only and ignored).
func (p *Profile) Pprof(o FoldOptions) *profile.Profile {
	count := "samples"
	if p.Mode == "trace" {
		count = "blocks"
	}
	pp := &profile.Profile{
		SampleType: []*profile.ValueType{
			{Type: count, Unit: "count"},
			{Type: "off_cpu", Unit: "nanoseconds"},
		},
		DefaultSampleType: "off_cpu",
		TimeNanos:         p.Start.UnixNano(),
		DurationNanos:     int64(p.Duration),
	}
	if p.Period > 0 {
		pp.PeriodType = &profile.ValueType{Type: "off_cpu", Unit: "nanoseconds"}
		pp.Period = int64(p.Period)
	}
	funcs := map[string]*profile.Function{}
	locs := map[string]*profile.Location{}
	loc := func(name, file string) *profile.Location {
		key := file + "\x00" + name
		if l := locs[key]; l != nil {
			return l
		}
		f := &profile.Function{ID: uint64(len(funcs) + 1), Name: name, SystemName: name, Filename: file}
		funcs[key] = f
		pp.Function = append(pp.Function, f)
		l := &profile.Location{ID: uint64(len(locs) + 1), Line: []profile.Line{{Function: f}}}
		locs[key] = l
		pp.Location = append(pp.Location, l)
		return l
	}
	for i := range p.Stacks {
		s := &p.Stacks[i]
		smp := &profile.Sample{Value: []int64{s.Samples, int64(s.OffCPU)}, Label: map[string][]string{}, NumLabel: map[string][]int64{}}
		if !o.UserOnly {
			for _, k := range s.Kernel {
				smp.Location = append(smp.Location, loc(k, "[kernel]"))
			}
		}
		if !o.KernelOnly {
			for _, u := range s.User {
				smp.Location = append(smp.Location, loc(u, "[user]"))
			}
		}
		smp.Location = append(smp.Location, loc(s.Group, "[thread]"))
		if s.State != "" {
			smp.Label["state"] = []string{s.State}
		}
		if s.Wchan != "" {
			smp.Label["wchan"] = []string{s.Wchan}
		}
		if s.PID != 0 {
			smp.NumLabel["pid"] = []int64{int64(s.PID)}
		}
		if s.TID != 0 {
			smp.NumLabel["tid"] = []int64{int64(s.TID)}
		}
		pp.Sample = append(pp.Sample, smp)
	}
	return pp
}

// WritePprof writes the gzipped pprof protobuf.
func (p *Profile) WritePprof(w io.Writer, o FoldOptions) error {
	pp := p.Pprof(o)
	if err := pp.CheckValid(); err != nil {
		return err
	}
	return pp.Write(w)
}
