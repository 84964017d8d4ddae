#!/usr/bin/perl
# emu-cu.pl IN.cu OUT.cc: the two rewrites cuda_emu needs (cuda_emu.h) of a
# kernels/cuda source, which g++ then compiles with cuda_emu.h included first:
#   name<<<grid, block, smem, stream>>>(args)
#     ->  emu::cfg(grid, block, smem, stream).k(name, "name")(args)
#   extern __shared__ [__align__(n)] T name[]; ->  T *name = (T *)emu::dyn_smem();
# and a #line so errors name the .cu file. Exits 1 if a `<<<` or an
# `extern __shared__` is left (a form this script does not know).
use strict;
use warnings;
my ($in, $out) = @ARGV;
open(my $fh, '<', $in) or die "emu-cu.pl: $in: $!\n";
local $/;
my $s = <$fh>;
close $fh;
$s =~ s/([A-Za-z_]\w*(?:\s*<[^<>;(){}]*>)?)\s*<<<(.*?)>>>\s*\(/emu::cfg($2).k($1, "$1")(/gs;
$s =~ s/extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w ]*?)\s+(\w+)\s*\[\s*\]\s*;/$1 *$2 = ($1 *)emu::dyn_smem();/g;
if ($s =~ /<<<|extern\s+__shared__/) {
  print STDERR "emu-cu.pl: $in: a launch or a dynamic shared array this script cannot rewrite\n";
  exit 1;
}
open(my $oh, '>', $out) or die "emu-cu.pl: $out: $!\n";
print $oh "#line 1 \"$in\"\n$s";
close $oh;
