fn main() -> anyhow::Result<()> {
    primus_service::main(
        primus_ps::SERVICE,
        primus_ps::ABOUT,
        primus_ps::default_settings(),
        primus_ps::run,
    )
}
