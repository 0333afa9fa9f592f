"""The parsers of runtime/slurm/commands.py against text Slurm's tools printed: squeue's
records with the field separator and a per-call end marker, scontrol's one-line job, node
and partition records, squeue --start, sbatch --parsable. No process is started."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from noduslocal.daemon.runtime.slurm import commands
from noduslocal.daemon.runtime.slurm.commands import (
    FIELD,
    ExitCode,
    GpuCount,
    decode_wait_status,
    node_usable,
    parse_cluster,
    parse_exit_code,
    parse_gpus,
    parse_keyvalues,
    parse_nodes,
    parse_queue,
    parse_sbatch,
    parse_show_job,
    parse_start_estimates,
    parse_time,
    sum_gpus,
)

# --- captured text --------------------------------------------------------------------------
# Everything below was printed by Slurm 22.05.8 (Debian's slurm-wlm) on the two-node test
# cluster of scripts/slurm-cluster.sh: jobs submitted with `runuser -u nlslurmcap -- sbatch`,
# squeue run with the --Format of commands._queue_format(END) and the END named beside each
# listing. Only the line breaks of the Python source are ours; the text is byte for byte.
# Job 280's comment holds FIELD, newlines, and a record forged with a marker it guessed.

END_EARLY = "\x1e0123456789abcdef"
END = "\x1e5f3a9c0d1b2e4f67"

# squeue --all --noheader --states=all --Format=... (END_EARLY): 1-5 another test's jobs
# as root, 6-10 ours (exit 3, kill -TERM $$, a GPU job running, an array 0-5%2).
QUEUE_EARLY = (
    '1\x1f1\x1fN/A\x1fCOMPLETED\x1fNone\x1fn1\x1f2026-12-06T22:06:16\x1f0\x1froot\x1f'
    'debug\x1f(null)\x1e0123456789abcdef\n'
    '2\x1f2\x1fN/A\x1fCOMPLETED\x1fNone\x1fn[1-2]\x1f2026-12-06T22:06:16\x1f0\x1froot\x1f'
    'debug\x1f(null)\x1e0123456789abcdef\n'
    '3\x1f3\x1fN/A\x1fCOMPLETED\x1fNone\x1fn1\x1f2026-12-06T22:07:57\x1f0\x1froot\x1f'
    'debug\x1fnoduslocal:8cd06e25ab31:1:1\x1e0123456789abcdef\n'
    '4\x1f4\x1fN/A\x1fCOMPLETED\x1fNone\x1fn1\x1f2026-12-06T22:08:00\x1f0\x1froot\x1f'
    'debug\x1fnoduslocal:8cd06e25ab31:2:1\x1e0123456789abcdef\n'
    '5\x1f5\x1fN/A\x1fFAILED\x1fNonZeroExitCode\x1fn1\x1f2026-12-06T22:08:03\x1f768\x1f'
    'root\x1fdebug\x1fnoduslocal:8cd06e25ab31:3:1\x1e0123456789abcdef\n'
    '6\x1f6\x1fN/A\x1fFAILED\x1fNonZeroExitCode\x1fn1\x1f2026-12-06T22:09:11\x1f768\x1f'
    'nlslurmcap\x1fdebug\x1fcap-x\x1e0123456789abcdef\n'
    '7\x1f7\x1fN/A\x1fFAILED\x1fJobLaunchFailure\x1fn2\x1f2026-12-06T22:09:11\x1f15\x1f'
    'nlslurmcap\x1fdebug\x1fcap-x sig\x1e0123456789abcdef\n'
    '9\x1f9\x1f1-5%2\x1fPENDING\x1fResources\x1f\x1f2027-12-06T22:09:13\x1f0\x1f'
    'nlslurmcap\x1fdebug\x1fcap-x arr\x1e0123456789abcdef\n'
    '8\x1f8\x1fN/A\x1fRUNNING\x1fNone\x1fn1\x1f2026-12-06T22:09:13\x1f0\x1fnlslurmcap\x1f'
    'debug\x1fcap-x run\x1e0123456789abcdef\n'
    '10\x1f9\x1f0\x1fRUNNING\x1fNone\x1fn2\x1f2026-12-06T22:09:13\x1f0\x1fnlslurmcap\x1f'
    'debug\x1fcap-x arr\x1e0123456789abcdef\n'
)

# The same with END, -u nlslurmcap: exit 3, kill -KILL $$, exit 0, cancelled running and
# pending, --begin=now+1hour, an array 0-3%1 with task 0 running.
QUEUE = (
    '95\x1f95\x1fN/A\x1fCANCELLED\x1fBeginTime\x1f\x1f2026-12-06T22:18:33\x1f0\x1f'
    'nlslurmcap\x1fdebug\x1f(null)\x1e5f3a9c0d1b2e4f67\n'
    '276\x1f276\x1fN/A\x1fCANCELLED\x1fNone\x1fn1\x1f2026-12-06T22:19:28\x1f15\x1f'
    'nlslurmcap\x1fdebug\x1fcap-run\x1e5f3a9c0d1b2e4f67\n'
    '277\x1f277\x1fN/A\x1fCANCELLED\x1fPriority\x1f\x1f2026-12-06T22:19:00\x1f0\x1f'
    'nlslurmcap\x1fdebug\x1fcap-cancel\x1e5f3a9c0d1b2e4f67\n'
    '275\x1f275\x1fN/A\x1fCOMPLETED\x1fNone\x1fn1\x1f2026-12-06T22:19:28\x1f0\x1f'
    'nlslurmcap\x1fdebug\x1fcap-ok\x1e5f3a9c0d1b2e4f67\n'
    '273\x1f273\x1fN/A\x1fFAILED\x1fNonZeroExitCode\x1fn1\x1f2026-12-06T22:19:25\x1f768\x1f'
    'nlslurmcap\x1fdebug\x1fcap-exit3\x1e5f3a9c0d1b2e4f67\n'
    '274\x1f274\x1fN/A\x1fFAILED\x1fJobLaunchFailure\x1fn1\x1f2026-12-06T22:19:25\x1f9\x1f'
    'nlslurmcap\x1fdebug\x1fcap-sig\x1e5f3a9c0d1b2e4f67\n'
    '278\x1f278\x1fN/A\x1fPENDING\x1fBeginTime\x1f\x1f2026-12-06T23:18:44\x1f0\x1f'
    'nlslurmcap\x1fdebug\x1fcap-held\x1e5f3a9c0d1b2e4f67\n'
    '279\x1f279\x1f1-3%1\x1fPENDING\x1fJobArrayTaskLimit\x1f\x1fN/A\x1f0\x1fnlslurmcap\x1f'
    'debug\x1fcap-arr\x1e5f3a9c0d1b2e4f67\n'
    '280\x1f280\x1fN/A\x1fPENDING\x1fBeginTime\x1f\x1f2026-12-06T23:18:45\x1f0\x1f'
    'nlslurmcap\x1fdebug\x1fcap-evil\x1f1\x1f2\nline2\x1eguessedmarker0\n'
    '99\x1f99\x1f\x1fPENDING\x1e5f3a9c0d1b2e4f67\n'
    '282\x1f282\x1fN/A\x1fPENDING\x1fBeginTime\x1f\x1f2026-12-06T23:19:02\x1f0\x1f'
    'nlslurmcap\x1fdebug\x1fcap-parsable\x1e5f3a9c0d1b2e4f67\n'
    '283\x1f279\x1f0\x1fRUNNING\x1fNone\x1fn1\x1f2026-12-06T22:19:28\x1f0\x1fnlslurmcap\x1f'
    'debug\x1fcap-arr\x1e5f3a9c0d1b2e4f67\n'
)

# squeue --start --all --noheader --format=%A<FIELD>%S -u nlslurmcap, at the same moment.
START = (
    '278\x1f2026-12-06T23:18:44\n280\x1f2026-12-06T23:18:45\n282\x1f2026-12-06T23:19:02\n'
    '279\x1fN/A\n'
)

# scontrol --oneliner show job N for jobs of QUEUE.
SHOW_EXIT3 = (
    'JobId=273 JobName=wrap UserId=nlslurmcap(1001) GroupId=nlslurmcap(1001) MCS_label=N/A '
    'Priority=4294901488 Nice=0 Account=(null) QOS=(null) JobState=FAILED '
    'Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 '
    'ExitCode=3:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A '
    'SubmitTime=2026-12-06T22:18:44 EligibleTime=2026-12-06T22:18:44 '
    'AccrueTime=2026-12-06T22:18:44 StartTime=2026-12-06T22:19:25 '
    'EndTime=2026-12-06T22:19:25 Deadline=N/A SuspendTime=None SecsPreSuspend=0 '
    'LastSchedEval=2026-12-06T22:19:25 Scheduler=Main Partition=debug '
    'AllocNode:Sid=localhost:7574 ReqNodeList=(null) ExcNodeList=(null) NodeList=n1 '
    'BatchHost=n1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=1,mem=100M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=1 MinMemoryNode=100M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/cap Comment=cap-exit3  StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null '
    'Power= \n'
)

SHOW_SIGNAL = (
    'JobId=274 JobName=wrap UserId=nlslurmcap(1001) GroupId=nlslurmcap(1001) MCS_label=N/A '
    'Priority=4294901487 Nice=0 Account=(null) QOS=(null) JobState=FAILED '
    'Reason=JobLaunchFailure Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 '
    'ExitCode=0:9 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A '
    'SubmitTime=2026-12-06T22:18:44 EligibleTime=2026-12-06T22:18:44 '
    'AccrueTime=2026-12-06T22:18:44 StartTime=2026-12-06T22:19:25 '
    'EndTime=2026-12-06T22:19:25 Deadline=N/A SuspendTime=None SecsPreSuspend=0 '
    'LastSchedEval=2026-12-06T22:19:25 Scheduler=Main Partition=debug '
    'AllocNode:Sid=localhost:7574 ReqNodeList=(null) ExcNodeList=(null) NodeList=n1 '
    'BatchHost=n1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=1,mem=100M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=1 MinMemoryNode=100M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/cap Comment=cap-sig  StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null '
    'Power= \n'
)

SHOW_CANCELLED = (
    'JobId=276 JobName=wrap UserId=nlslurmcap(1001) GroupId=nlslurmcap(1001) MCS_label=N/A '
    'Priority=4294901485 Nice=0 Account=(null) QOS=(null) JobState=CANCELLED Reason=None '
    'Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15 '
    'RunTime=00:00:19 TimeLimit=00:02:00 TimeMin=N/A SubmitTime=2026-12-06T22:18:44 '
    'EligibleTime=2026-12-06T22:18:44 AccrueTime=2026-12-06T22:18:44 '
    'StartTime=2026-12-06T22:19:28 EndTime=2026-12-06T22:19:47 Deadline=N/A SuspendTime=None '
    'SecsPreSuspend=0 LastSchedEval=2026-12-06T22:19:28 Scheduler=Main Partition=debug '
    'AllocNode:Sid=localhost:7574 ReqNodeList=(null) ExcNodeList=(null) NodeList=n1 '
    'BatchHost=n1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=1,mem=100M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=1 MinMemoryNode=100M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/cap Comment=cap-run  StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null '
    'Power= TresPerNode=gres:gpu:fake:1 \n'
)

SHOW_ARRAY = (
    'JobId=279 ArrayJobId=279 ArrayTaskId=1-3%1 ArrayTaskThrottle=1 JobName=wrap '
    'UserId=nlslurmcap(1001) GroupId=nlslurmcap(1001) MCS_label=N/A Priority=4294901482 '
    'Nice=0 Account=(null) QOS=(null) JobState=PENDING Reason=JobArrayTaskLimit '
    'Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 '
    'RunTime=00:00:00 TimeLimit=00:02:00 TimeMin=N/A SubmitTime=2026-12-06T22:18:44 '
    'EligibleTime=Unknown AccrueTime=2026-12-06T22:18:46 StartTime=Unknown EndTime=Unknown '
    'Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-06T22:19:28 '
    'Scheduler=Main Partition=debug AllocNode:Sid=localhost:7574 ReqNodeList=(null) '
    'ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 '
    'ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=100M,node=1,billing=1 Socks/Node=* '
    'NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=100M MinTmpDiskNode=0 '
    'Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) '
    'Network=(null) Command=(null) WorkDir=/tmp/cap Comment=cap-arr  StdErr=/dev/null '
    'StdIn=/dev/null StdOut=/dev/null Power= \n'
    'JobId=283 ArrayJobId=279 ArrayTaskId=0 ArrayTaskThrottle=1 JobName=wrap '
    'UserId=nlslurmcap(1001) GroupId=nlslurmcap(1001) MCS_label=N/A Priority=4294901482 '
    'Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) '
    'Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:19 '
    'TimeLimit=00:02:00 TimeMin=N/A SubmitTime=2026-12-06T22:18:44 '
    'EligibleTime=2026-12-06T22:18:46 AccrueTime=2026-12-06T22:18:46 '
    'StartTime=2026-12-06T22:19:28 EndTime=2026-12-06T22:21:28 Deadline=N/A SuspendTime=None '
    'SecsPreSuspend=0 LastSchedEval=2026-12-06T22:19:28 Scheduler=Main Partition=debug '
    'AllocNode:Sid=localhost:7574 ReqNodeList=(null) ExcNodeList=(null) NodeList=n1 '
    'BatchHost=n1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=1,mem=100M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=1 MinMemoryNode=100M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/cap Comment=cap-arr  StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null '
    'Power= \n'
)

SHOW_COMMENT = (
    'JobId=280 JobName=wrap UserId=nlslurmcap(1001) GroupId=nlslurmcap(1001) MCS_label=N/A '
    'Priority=4294901481 Nice=0 Account=(null) QOS=(null) JobState=PENDING Reason=BeginTime '
    'Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 '
    'RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-06T22:18:45 '
    'EligibleTime=2026-12-06T23:18:45 AccrueTime=2026-12-06T23:18:45 '
    'StartTime=2026-12-06T23:18:45 EndTime=Unknown Deadline=N/A SuspendTime=None '
    'SecsPreSuspend=0 LastSchedEval=2026-12-06T22:18:45 Scheduler=Main Partition=debug '
    'AllocNode:Sid=localhost:7574 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 '
    'NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* '
    'TRES=cpu=1,mem=100M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* '
    'MinCPUsNode=1 MinMemoryNode=100M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 '
    'OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) '
    'WorkDir=/tmp/cap Comment=cap-evil\x1f1\x1f2\nline2\x1eguessedmarker0\n'
    '99\x1f99\x1f\x1fPENDING  StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= \n'
)

# scontrol --oneliner --details show node, with QUEUE's jobs on n1 (one holds a GPU) and
# another test's on n2.
NODES = (
    'NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=2 CPUEfctv=4 CPUTot=4 CPULoad=1.68 '
    'AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:fake:2 GresDrain=N/A '
    'GresUsed=gpu:fake:1(IDX:0) NodeAddr=127.0.0.1 NodeHostName=vm Port=17001 '
    'Version=22.05.8 OS=Linux 6.18.44-fc-v1300 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 '
    'AllocMem=200 FreeMem=23416 Sockets=4 Boards=1 State=MIXED ThreadsPerCore=1 TmpDisk=0 '
    'Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  BootTime=2026-12-06T22:04:29 '
    'SlurmdStartTime=2026-12-06T22:06:13 LastBusyTime=2026-12-06T22:19:27 '
    'CfgTRES=cpu=4,mem=8000M,billing=4 AllocTRES=cpu=2,mem=200M CapWatts=n/a CurrentWatts=0 '
    'AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n'
    'NodeName=n2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=4 CPUTot=4 CPULoad=1.68 '
    'AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:fake:2 GresDrain=N/A '
    'GresUsed=gpu:fake:0(IDX:N/A) NodeAddr=127.0.0.1 NodeHostName=vm Port=17002 '
    'Version=22.05.8 OS=Linux 6.18.44-fc-v1300 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 '
    'AllocMem=8000 FreeMem=23416 Sockets=4 Boards=1 State=MIXED ThreadsPerCore=1 TmpDisk=0 '
    'Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  BootTime=2026-12-06T22:04:29 '
    'SlurmdStartTime=2026-12-06T22:06:13 LastBusyTime=2026-12-06T22:19:28 '
    'CfgTRES=cpu=4,mem=8000M,billing=4 AllocTRES=cpu=1,mem=8000M CapWatts=n/a CurrentWatts=0 '
    'AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n'
)

# scontrol --oneliner show partition.
PARTITIONS = (
    'PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL '
    'Default=YES QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 '
    'Hidden=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO '
    'MaxCPUsPerNode=UNLIMITED Nodes=n[1-2] PriorityJobFactor=1 PriorityTier=1 RootOnly=NO '
    'ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=8 '
    'TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED '
    'MaxMemPerNode=UNLIMITED TRES=cpu=8,mem=16000M,node=2,billing=8\n'
)

# --- sbatch -------------------------------------------------------------------------------


def test_sbatch_parsable_gives_the_job_id() -> None:
    assert parse_sbatch("282\n") == 282
    # On a multi-cluster setup --parsable prints "id;cluster".
    assert parse_sbatch("282;noduslocal-test\n") == 282
    assert parse_sbatch("\n  283\n") == 283


@pytest.mark.parametrize("text", ["", "\n", "Submitted batch job 282\n",
                                  "sbatch: error: Batch job submission failed\n"])
def test_sbatch_without_a_job_id_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_sbatch(text)


def test_a_script_text_without_an_interpreter_is_refused_before_sbatch_runs() -> None:
    with pytest.raises(ValueError, match="starts with #!"):
        asyncio.run(commands.submit("nobody", "echo hi\n"))


# --- squeue -------------------------------------------------------------------------------


def test_the_queue_format_is_the_one_the_fixtures_were_printed_with() -> None:
    assert commands._queue_format(END) == (
        "JobID:0\x1f,ArrayJobID:0\x1f,ArrayTaskID:0\x1f,State:0\x1f,Reason:0\x1f,"
        "NodeList:0\x1f,StartTime:0\x1f,exit_code:0\x1f,UserName:0\x1f,Partition:0\x1f,"
        "Comment:0" + END)


def test_each_call_gets_a_marker_of_its_own_that_squeue_cannot_read_as_a_size() -> None:
    first, second = commands._marker(), commands._marker()
    assert first != second
    for marker in (first, second):
        assert marker[0] == "\x1e" and not marker[0].isdigit()
        assert FIELD not in marker and "\n" not in marker


def test_queue_records_of_every_kind() -> None:
    entries = parse_queue(QUEUE, END)
    assert sorted(entries) == [95, 273, 274, 275, 276, 277, 278, 279, 280, 282, 283]

    failed = entries[273]
    assert (failed.state, failed.reason, failed.nodes) == ("FAILED", "NonZeroExitCode", "n1")
    assert failed.exit == ExitCode(3, 0) and failed.ended
    assert (failed.user, failed.partition, failed.comment) == ("nlslurmcap", "debug",
                                                               "cap-exit3")
    assert failed.start == datetime(2026, 12, 6, 22, 19, 25).astimezone()
    assert failed.array_job_id is None and failed.array_task is None

    # `kill -KILL $$` in the batch script: Slurm calls it a launch failure.
    assert entries[274].exit == ExitCode(0, 9)
    assert entries[274].reason == "JobLaunchFailure"
    assert entries[275].exit == ExitCode(0, 0) and entries[275].reason is None
    # Cancelled while running (SIGTERM) and while pending (never ran: status 0).
    assert (entries[276].state, entries[276].exit) == ("CANCELLED", ExitCode(0, 15))
    assert (entries[277].state, entries[277].exit, entries[277].nodes) == (
        "CANCELLED", ExitCode(0, 0), "")

    pending = entries[278]
    assert (pending.state, pending.reason, pending.nodes) == ("PENDING", "BeginTime", "")
    assert not pending.ended and pending.exit is None
    assert pending.start == datetime(2026, 12, 6, 23, 18, 44).astimezone()

    # An array: the tasks still pending together under the array's id, a started task
    # under an id of its own.
    waiting, task = entries[279], entries[283]
    assert (waiting.array_job_id, waiting.array_task, waiting.array_task_id) == (
        279, "1-3%1", None)
    assert waiting.start is None and waiting.reason == "JobArrayTaskLimit"
    assert (task.array_job_id, task.array_task, task.array_task_id) == (279, "0", 0)
    assert (task.state, task.exit, task.ended) == ("RUNNING", None, False)

    # A job without a comment says "(null)".
    assert entries[95].comment == ""


def test_a_comment_holding_the_separator_newlines_and_a_forged_record_stays_one_comment() -> None:
    entries = parse_queue(QUEUE, END)
    assert 99 not in entries
    evil = entries[280]
    assert evil.comment == ("cap-evil\x1f1\x1f2\nline2\x1eguessedmarker0\n"
                            "99\x1f99\x1f\x1fPENDING")
    assert (evil.state, evil.user, evil.nodes) == ("PENDING", "nlslurmcap", "")
    # The record after it is read whole.
    assert entries[282].comment == "cap-parsable"


def test_only_the_per_call_marker_ends_a_record() -> None:
    # Job 280's comment made into a whole forged record of another user's job (ours).
    whole = ("99\x1f99\x1fN/A\x1fCOMPLETED\x1fNone\x1fn1\x1f2026-12-06T22:19:25\x1f0\x1f"
             "victim\x1fdebug\x1fnoduslocal:8cd06e25ab31:7:1")
    text = QUEUE.replace("99\x1f99\x1f\x1fPENDING", whole)
    entries = parse_queue(text, END)
    assert 99 not in entries
    assert entries[280].comment.endswith(whole)
    # Only a comment that knew the marker of the call could end a record early.
    guessed = "\x1eguessedmarker0"
    fooled = parse_queue(text.replace(END, guessed), guessed)
    assert fooled[99].user == "victim"
    # Parsed with another marker than squeue printed, nothing is read at all.
    assert parse_queue(QUEUE, "\x1e" + "0" * 16) == {}


def test_queue_filtered_by_a_comment_prefix() -> None:
    ours = parse_queue(QUEUE_EARLY, END_EARLY, "noduslocal:8cd06e25ab31:")
    assert sorted(ours) == [3, 4, 5]
    assert ours[5].exit == ExitCode(3, 0) and ours[5].user == "root"
    assert sorted(parse_queue(QUEUE_EARLY, END_EARLY, "cap-x")) == [6, 7, 8, 9, 10]
    assert sorted(parse_queue(QUEUE_EARLY, END_EARLY, "cap-x arr")) == [9, 10]
    assert parse_queue(QUEUE_EARLY, END_EARLY, "noduslocal:other:") == {}
    # No prefix: every record, those without a comment too.
    assert sorted(parse_queue(QUEUE_EARLY, END_EARLY)) == list(range(1, 11))


def test_queue_running_pending_and_a_two_node_job() -> None:
    entries = parse_queue(QUEUE_EARLY, END_EARLY)
    assert (entries[8].state, entries[8].nodes, entries[8].exit) == ("RUNNING", "n1", None)
    assert entries[2].nodes == "n[1-2]"
    # Pending for resources behind jobs without a time limit: Slurm's estimate is a year on.
    assert (entries[9].state, entries[9].reason) == ("PENDING", "Resources")
    assert entries[9].start == datetime(2027, 12, 6, 22, 9, 13).astimezone()
    assert entries[7].exit == ExitCode(0, 15)


def test_queue_skips_what_is_not_a_whole_record() -> None:
    record = QUEUE.split(END)[0] + END + "\n"
    assert sorted(parse_queue(record, END)) == [95]
    # Text after the last marker is no record; nor is one with fields missing.
    assert sorted(parse_queue(record + "96\x1f96\x1fN/A", END)) == [95]
    short = "97\x1f97\x1fN/A\x1fPENDING" + END + "\n"
    assert sorted(parse_queue(record + short, END)) == [95]
    assert parse_queue("", END) == {}


@pytest.mark.parametrize(("status", "expected"), [
    ("0", ExitCode(0, 0)),
    ("768", ExitCode(3, 0)),  # exit 3
    ("256", ExitCode(1, 0)),
    ("15", ExitCode(0, 15)),  # SIGTERM
    ("9", ExitCode(0, 9)),  # SIGKILL
    ("134", ExitCode(0, 6)),  # SIGABRT with a core dump
    ("N/A", None),
    ("", None),
])
def test_decode_wait_status(status: str, expected: ExitCode | None) -> None:
    assert decode_wait_status(status) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("3:0", ExitCode(3, 0)),
    ("0:15", ExitCode(0, 15)),
    ("0:9", ExitCode(0, 9)),
    ("0:0", ExitCode(0, 0)),
    ("3", ExitCode(3, 0)),
    ("", None),
    ("N/A", None),
])
def test_parse_exit_code(text: str, expected: ExitCode | None) -> None:
    assert parse_exit_code(text) == expected


def test_parse_time_is_local_time_made_aware() -> None:
    parsed = parse_time("2026-12-06T22:19:25")
    assert parsed is not None and parsed.tzinfo is not None
    assert parsed == datetime(2026, 12, 6, 22, 19, 25).astimezone()
    assert parse_time(" 2026-12-06T22:19:25\n") == parsed


@pytest.mark.parametrize("text", ["N/A", "Unknown", "None", "", "(null)", "22:09:13"])
def test_parse_time_of_no_time_is_none(text: str) -> None:
    # "22:09:13" is what SLURM_TIME_FORMAT=relative makes of today's times.
    assert parse_time(text) is None


def test_start_estimates() -> None:
    assert parse_start_estimates(START) == {
        278: datetime(2026, 12, 6, 23, 18, 44).astimezone(),
        280: datetime(2026, 12, 6, 23, 18, 45).astimezone(),
        282: datetime(2026, 12, 6, 23, 19, 2).astimezone(),
        279: None,  # an array held back by its throttle has no estimate
    }
    assert parse_start_estimates("") == {}
    assert parse_start_estimates("\n" + START + "squeue: error: x\n") == \
        parse_start_estimates(START)


# --- scontrol -----------------------------------------------------------------------------


def test_keyvalues_of_a_job_record() -> None:
    fields = parse_keyvalues(SHOW_EXIT3.strip())
    assert fields["JobId"] == "273"
    assert fields["JobState"] == "FAILED"
    assert fields["Reason"] == "NonZeroExitCode"
    assert fields["ExitCode"] == "3:0"
    assert fields["NodeList"] == "n1" and fields["BatchHost"] == "n1"
    # Keys holding ":" and "/", values holding "=" and ",".
    assert fields["AllocNode:Sid"] == "localhost:7574"
    assert fields["ReqB:S:C:T"] == "0:0:*:*"
    assert fields["CPUs/Task"] == "1"
    assert fields["TRES"] == "cpu=1,mem=100M,node=1,billing=1"
    # Keys that end in another key's name are keys of their own.
    assert fields["ReqNodeList"] == "(null)" and fields["ExcNodeList"] == "(null)"
    assert fields["UserId"] == "nlslurmcap(1001)"
    assert fields["Comment"] == "cap-exit3" and fields["Power"] == ""
    assert fields["StdOut"] == "/dev/null"


def test_keyvalues_of_a_node_record_with_spaces_in_values() -> None:
    fields = parse_keyvalues(NODES.splitlines()[0])
    assert fields["OS"] == "Linux 6.18.44-fc-v1300 #1 SMP PREEMPT_DYNAMIC @0"
    assert fields["GresUsed"] == "gpu:fake:1(IDX:0)"
    assert fields["CfgTRES"] == "cpu=4,mem=8000M,billing=4"
    assert fields["ExtSensorsTemp"] == "n/s"


def test_show_job_of_ended_jobs() -> None:
    exited = parse_show_job(SHOW_EXIT3, 273)
    assert exited is not None
    assert parse_exit_code(exited["ExitCode"]) == ExitCode(3, 0)
    signalled = parse_show_job(SHOW_SIGNAL, 274)
    assert signalled is not None and signalled["JobState"] == "FAILED"
    assert parse_exit_code(signalled["ExitCode"]) == ExitCode(0, 9)
    cancelled = parse_show_job(SHOW_CANCELLED, 276)
    assert cancelled is not None
    assert (cancelled["JobState"], cancelled["ExitCode"]) == ("CANCELLED", "0:15")
    assert cancelled["TresPerNode"] == "gres:gpu:fake:1"


def test_show_job_of_an_array_picks_the_record_with_the_id_asked_for() -> None:
    pending = parse_show_job(SHOW_ARRAY, 279)
    assert pending is not None
    assert (pending["JobState"], pending["ArrayTaskId"], pending["NodeList"]) == (
        "PENDING", "1-3%1", "")
    task = parse_show_job(SHOW_ARRAY, 283)
    assert task is not None
    assert (task["JobState"], task["ArrayJobId"], task["ArrayTaskId"]) == ("RUNNING", "279",
                                                                          "0")
    assert parse_show_job(SHOW_ARRAY, 280) is None
    assert parse_show_job("", 279) is None


def test_show_job_of_an_array_task_is_its_own_record_or_the_waiting_tasks_one() -> None:
    started = parse_show_job(SHOW_ARRAY, 279, task=0)
    assert started is not None and (started["JobId"], started["JobState"]) == ("283",
                                                                             "RUNNING")
    for task in (1, 2, 3):  # not started: the array's own record holds them
        waiting = parse_show_job(SHOW_ARRAY, 279, task=task)
        assert waiting is not None and waiting["JobState"] == "PENDING"
    assert parse_show_job(SHOW_ARRAY, 279, task=4) is None
    assert parse_show_job(SHOW_ARRAY, 283, task=0) is None  # 283 is a task, not an array


@pytest.mark.parametrize(("text", "tasks"), [
    ("3", {3}), ("2-5%2", {2, 3, 4, 5}), ("[0,4-8:2]", {0, 4, 6, 8}), ("0,2,5,7%2", {0, 2, 5, 7}),
    ("N/A", set()), ("", set()),
])
def test_array_tasks_as_slurm_writes_them(text: str, tasks: set[int]) -> None:
    assert commands.array_tasks(text) == tasks


def test_array_spec_packs_runs_of_indexes_as_ranges() -> None:
    assert commands.array_spec([0, 1, 2, 3], 2) == "0-3%2"
    assert commands.array_spec([9, 0, 1, 2, 5, 7, 8], 3) == "0-2,5,7-9%3"
    assert commands.array_spec([4], 1) == "4%1"
    spec = commands.array_spec(range(0, 1000, 2), 4)
    assert commands.array_tasks(spec) == set(range(0, 1000, 2))


def test_show_job_keeps_a_comment_with_newlines_in_its_record() -> None:
    job = parse_show_job(SHOW_COMMENT, 280)
    assert job is not None
    assert job["JobState"] == "PENDING"
    assert job["Comment"] == ("cap-evil\x1f1\x1f2\nline2\x1eguessedmarker0\n"
                              "99\x1f99\x1f\x1fPENDING")
    assert job["StdErr"] == "/dev/null"
    # A comment that forges a whole record of the same job comes after the real one.
    forged = SHOW_COMMENT.replace("line2", "JobId=280 JobState=COMPLETED ExitCode=0:0")
    job = parse_show_job(forged, 280)
    assert job is not None and job["JobState"] == "PENDING"
    # So does one that forges keys within the record: the first value of a key wins.
    forged = SHOW_COMMENT.replace("line2", "x JobState=COMPLETED ExitCode=0:0 NodeList=n9")
    job = parse_show_job(forged, 280)
    assert job is not None
    assert (job["JobState"], job["ExitCode"], job["NodeList"]) == ("PENDING", "0:0", "")


@pytest.mark.xfail(strict=True, reason="JobName comes before JobState and the owner may set "
                                       "it (scontrol update JobName=...): the first value "
                                       "of a key wins, so a name can forge the state")
def test_a_job_name_cannot_forge_the_state() -> None:
    # `scontrol update jobid=33 name="x JobState=COMPLETED ExitCode=0:0 NodeList=evil"`
    # as the job's owner was accepted by 22.05.8 on this cluster.
    forged = SHOW_EXIT3.replace("JobName=wrap", "JobName=x JobState=COMPLETED ExitCode=0:0")
    job = parse_show_job(forged, 273)
    assert job is not None and job["JobState"] == "FAILED"


@pytest.mark.parametrize(("text", "expected"), [
    # as this cluster prints them
    ("gpu:fake:2", {"fake": 2}),
    ("gpu:fake:1(IDX:0)", {"fake": 1}),
    ("gpu:fake:0(IDX:N/A)", {"fake": 0}),
    ("(null)", {}),
    ("N/A", {}),
    ("", {}),
    # forms of other sites' configurations
    ("gpu:2(S:0-1)", {"": 2}),
    ("gpu:a100:2(IDX:0,2),shard:8", {"a100": 2}),
    ("gpu:a100:1(S:0),gpu:v100:2(S:1)", {"a100": 1, "v100": 2}),
    ("gpu:a100:1,gpu:a100:3", {"a100": 4}),
    ("gpu", {"": 1}),
    ("gpu:tesla", {"tesla": 1}),
    ("shard:8,mps:100", {}),
])
def test_parse_gpus(text: str, expected: dict[str, int]) -> None:
    assert parse_gpus(text) == expected


@pytest.mark.parametrize(("state", "usable"), [
    ("IDLE", True),
    ("MIXED", True),
    ("ALLOCATED", True),
    ("COMPLETING", True),
    ("MIXED+COMPLETING", True),
    ("IDLE+DRAIN", False),
    ("MIXED+DRAIN", False),  # draining: running jobs finish, no new ones
    ("DOWN", False),
    ("DOWN*", False),
    ("IDLE*", False),
    ("DOWN+NOT_RESPONDING", False),
    ("IDLE+NOT_RESPONDING", False),
    ("IDLE+CLOUD+POWERED_DOWN", False),
    ("ALLOCATED+MAINT", False),
    ("FAIL", False),
    ("FUTURE", False),
    ("UNKNOWN", False),
    ("IDLE+INVALID_REG", False),
])
def test_node_usable(state: str, usable: bool) -> None:
    assert node_usable(state) is usable


def test_nodes_with_their_cpus_memory_and_gpus() -> None:
    n1, n2 = parse_nodes(NODES)
    assert (n1.name, n1.state, n1.usable, n1.partitions) == ("n1", "MIXED", True, ("debug",))
    assert (n1.cpus, n1.cpus_used, n1.memory_mb, n1.memory_used_mb) == (4, 2, 8000, 200)
    assert n1.gpus == {"fake": GpuCount(total=2, used=1, free=1)}
    assert n1.reason is None
    assert (n2.cpus_used, n2.memory_used_mb) == (1, 8000)
    assert n2.gpus == {"fake": GpuCount(total=2, used=0, free=2)}


def test_a_drained_node_has_no_free_gpus_and_says_why() -> None:
    # n2's captured record as the admin's `scontrol update nodename=n2 state=drain
    # reason="disk swap"` leaves it: State and Reason are ours, the rest captured.
    first, second = NODES.splitlines()
    drained = second.replace("State=MIXED", "State=MIXED+DRAIN") + \
        " Reason=disk swap [root@2026-12-06T22:30:00]"
    n1, n2 = parse_nodes(first + "\n" + drained + "\n")
    assert n1.usable and not n2.usable
    assert n2.state == "MIXED+DRAIN"
    assert n2.gpus == {"fake": GpuCount(total=2, used=0, free=0)}
    assert n2.reason == "disk swap [root@2026-12-06T22:30:00]"


def test_cluster_joins_partitions_and_nodes() -> None:
    (debug,) = parse_cluster(PARTITIONS, NODES)
    assert (debug.name, debug.default, debug.state) == ("debug", True, "UP")
    assert [n.name for n in debug.nodes] == ["n1", "n2"]
    assert debug.gpus == {"fake": GpuCount(total=4, used=1, free=3)}


def test_cluster_with_a_second_partition_over_one_node() -> None:
    # A "gpu" partition over n2 only, written as scontrol would print it (ours, from the
    # captured debug partition); n2 names both partitions.
    gpu = PARTITIONS.replace("PartitionName=debug", "PartitionName=gpu") \
        .replace("Default=YES", "Default=NO").replace("Nodes=n[1-2]", "Nodes=n2") \
        .replace("State=UP", "State=DOWN")
    first, second = NODES.splitlines()
    nodes = first + "\n" + second.replace("Partitions=debug", "Partitions=debug,gpu") + "\n"
    debug, down = parse_cluster(PARTITIONS + gpu, nodes)
    assert [n.name for n in debug.nodes] == ["n1", "n2"]
    assert (down.name, down.default, down.state) == ("gpu", False, "DOWN")
    assert [n.name for n in down.nodes] == ["n2"]
    assert down.gpus == {"fake": GpuCount(total=2, used=0, free=2)}
    assert parse_cluster("", nodes) == []


def test_sum_gpus() -> None:
    assert sum_gpus([]) == {}
    assert sum_gpus([{"a": GpuCount(2, 1, 1)},
                     {"a": GpuCount(2, 0, 0), "b": GpuCount(1, 0, 1)},
                     {}]) == {"a": GpuCount(4, 1, 1), "b": GpuCount(1, 0, 1)}
