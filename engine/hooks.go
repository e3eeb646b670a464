package engine

import (
	"fmt"
	"time"
)

// Step is one step of an instrumentation request, as KernInst's Figure 4
// names them (on x86-64).
type Step uint8

const (
	// StepResolve (lookup, read, decode, classify, liveness) and
	// StepLiveness (alone) are the planner's (splice.Planner.Resolve,
	// Liveness); callers that time a whole request time them around it.
	StepResolve Step = iota
	StepLiveness
	StepPatchAlloc  // patch heap allocation
	StepCodegen     // build and verify the patch, with relocation
	StepPatchWrite  // write the patch into the patch heap
	StepSlotFind    // take a springboard slot in rel8 reach
	StepSpringboard // write the slot's jmp rel32 to the patch
	StepSplice      // the driver's splice of the instruction (first request)
	StepResplice    // re-point a splice (or slot) at a rebuilt patch
	StepUnsplice    // put the original bytes back (last request gone)
	StepFree        // free a replaced patch (after an RCU-tasks grace period)
	numSteps
)

var stepNames = [numSteps]string{"resolve", "liveness", "patch_alloc", "codegen", "patch_write", "slot_find",
	"springboard", "splice", "resplice", "unsplice", "free"}

func (s Step) String() string {
	if s < numSteps {
		return stepNames[s]
	}
	return fmt.Sprintf("Step(%d)", int(s))
}

// Hooks observe the steps of the changes a request causes: each step the
// engine takes for adding or removing the request is reported with how
// long it took, and so is the free of every patch that change retired,
// later, from the batched reclaim (another goroutine). A request without
// hooks costs nothing extra.
type Hooks interface {
	Step(s Step, d time.Duration)
}

// HookFunc adapts a function to Hooks.
type HookFunc func(Step, time.Duration)

func (f HookFunc) Step(s Step, d time.Duration) { f(s, d) }

// timed runs f as one occurrence of step s for h (nil: untimed).
func timed(h Hooks, s Step, f func() error) error {
	if h == nil {
		return f()
	}
	t := time.Now()
	err := f()
	h.Step(s, time.Since(t))
	return err
}
